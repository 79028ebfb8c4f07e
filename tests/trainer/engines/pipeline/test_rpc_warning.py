"""torch's "ProcessGroupGloo as a ProcessGroup is deprecated" warning, which its own RPC set-up triggers,
is filtered around the kit's RPC calls only, and by that message only."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = """
import contextlib, socket, sys, warnings
import torch.distributed.rpc as rpc
from maskrcnn_dist.engines.pipeline.runtime import torch_rpc_warning_filtered

warnings.simplefilter("always")
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
options = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{port}", _transports=["uv"])
around = torch_rpc_warning_filtered() if sys.argv[1] == "filtered" else contextlib.nullcontext()
with around:
    rpc.init_rpc("solo", rank=0, world_size=1, rpc_backend_options=options)
    warnings.warn("another warning, kept")
    rpc.shutdown()
warnings.warn("You are using a Backend <class 'x.ProcessGroupGloo'> as a ProcessGroup, outside: kept")
"""


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["filtered", "plain"])
def test_the_gloo_deprecation_warning_is_filtered_around_the_kits_rpc_calls_only(mode: str):
    env = {**os.environ, "PYTHONWARNINGS": ""}
    done = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    torch_lines = [line for line in done.stderr.splitlines() if "ProcessGroupGloo'> as a ProcessGroup" in line]
    assert "another warning, kept" in done.stderr
    assert any("outside: kept" in line for line in torch_lines)
    from_torch = [line for line in torch_lines if "outside: kept" not in line]
    assert (from_torch == []) == (mode == "filtered"), done.stderr  # plain: torch does warn (else this proves nothing)
