"""The device-map guard (engines/pipeline/guard.py): through real RPC calls of one process to itself, every
result and RRef value is walked as TensorPipe walks it with device maps, and refused when it holds a
lambda, a lock, a module, or too many plain bytes; without the guard the CPU agent lets all of it pass."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from maskrcnn_launcher.contract import DEVICE_MAP_GUARD

from maskrcnn_dist.engines.pipeline import guard
from maskrcnn_dist.engines.pipeline.rounds import Turnstile
from maskrcnn_dist.errors import ConfigError
from maskrcnn_dist.modeling.optim import lr_factor

SCRIPT = Path(__file__).with_name("guard_calls.py")


@pytest.fixture(scope="module")
def outcomes() -> dict[str, dict[str, str]]:
    """guard_calls.py's calls, with and without the guard: call -> "ok" or the caller's error."""
    found = {}
    for mode in ("guarded", "plain"):
        env = {**os.environ, DEVICE_MAP_GUARD: "1" if mode == "guarded" else "0"}
        done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=180, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        found[mode] = json.loads(done.stdout.splitlines()[-1])
    return found


def test_tensors_and_small_values_pass(outcomes) -> None:
    for call in ("tensors", "tensors via remote", "async tensors", "chained tensors", "nothing"):
        assert outcomes["guarded"][call] == "ok", call


@pytest.mark.parametrize(
    ("call", "cause", "escapes_cpu"),
    [
        # An RRef's value is never pickled by a CPU agent: a host kept in an RRef passes every CPU run and
        # stops at the first step on a GPU, as on the H200 (the lambda, then the Turnstile's Condition).
        ("host with a lambda via remote", "Can't pickle local object", True),
        ("host with a turnstile via remote", "RLock", True),
        ("a local RRef to a host", "Can't pickle local object", True),
        # Pickles on CPU, yet is not tensors and small values.
        ("a module", "torch.nn.modules.linear.Linear would cross", True),
        ("a long list of floats", "bytes besides its tensors", True),
        # A function's result is pickled for the response anyway; the guard names the cause first.
        ("host with a lambda", "Can't pickle local object", False),
        ("host with a turnstile", "RLock", False),
        ("a plain lock", "cannot pickle '_thread.lock'", False),  # torch's walk skips a Lock; the guard does not
        ("async host with a lambda", "Can't pickle local object", False),
        ("chained host with a lambda", "Can't pickle local object", False),
    ],
)
def test_the_guard_refuses_what_a_device_map_agent_cannot_send(outcomes, call: str, cause: str, escapes_cpu) -> None:
    # RPC re-raises an error of a type outside builtins as a RuntimeError that starts with the type's name.
    got = outcomes["guarded"][call]
    assert "DeviceMapGuardError: device-map guard on solo: the result of " in got and cause in got, got
    if call != "a local RRef to a host":  # raised where it was made, not sent by RPC
        assert "the result of __main__." in got, got  # names the function
    assert (outcomes["plain"][call] == "ok") == escapes_cpu, outcomes["plain"][call]


def test_an_error_still_reaches_the_caller_as_itself(outcomes) -> None:
    assert outcomes["guarded"]["raises"].startswith("ValueError") and "stage failed" in outcomes["guarded"]["raises"]


def test_the_walk_is_torchs_own() -> None:
    """check() fails where torch._jit_internal._extract_tensors (what the agent runs) fails, on the pieces
    a stage host is made of; a module-level schedule and tensor-only values pass it."""
    for piece in (lambda it: 1.0, Turnstile()):
        with pytest.raises(Exception) as walked:
            torch._jit_internal._extract_tensors(piece)
        with pytest.raises(guard.DeviceMapGuardError, match="TensorPipe's tensor walk fails") as checked:
            guard.check(piece, None)
        assert str(walked.value) in str(checked.value)
    import functools

    from maskrcnn_dist.config import OptimConfig

    guard.check(functools.partial(lr_factor, cfg=OptimConfig(), iters_per_epoch=2, total_steps=4), None)
    guard.check({"x": torch.zeros(1000, 1000)}, 64)  # tensors do not count towards the bound
    with pytest.raises(guard.DeviceMapGuardError, match="holds machinery or state"):
        guard.check({"lock": threading.Lock()}, guard.DEFAULT_MAX_PLAIN_BYTES)


def test_the_variable_turns_it_on_and_a_bad_value_is_named() -> None:
    assert guard.enabled({DEVICE_MAP_GUARD: "1"}) and guard.enabled({DEVICE_MAP_GUARD: " on "})
    assert not guard.enabled({}) and not guard.enabled({DEVICE_MAP_GUARD: "0"})
    with pytest.raises(ConfigError, match=f"{DEVICE_MAP_GUARD}='maybe': expected 1"):
        guard.enabled({DEVICE_MAP_GUARD: "maybe"})


def test_install_and_undo_restore_torch() -> None:
    import torch.distributed.rpc as rpc
    import torch.distributed.rpc.internal as internal

    run_function, rref_init = internal._run_function, rpc.RRef.__init__
    with guard.installed():
        assert guard.is_installed()
        with pytest.raises(RuntimeError, match="installed in this process already"):
            guard.install()
    assert internal._run_function is run_function and rpc.RRef.__init__ == rref_init
    assert not guard.is_installed()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_an_empty_cuda_tensor_is_refused() -> None:
    with pytest.raises(guard.DeviceMapGuardError, match="empty CUDA tensor"):
        guard.check({"boxes": torch.zeros(0, 4, device="cuda")}, None)
    guard.check({"boxes": torch.zeros(1, 4, device="cuda")}, None)
