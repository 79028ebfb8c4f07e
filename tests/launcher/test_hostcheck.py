"""What a topology asks of the pods' host, said before anything starts: an interface the host lacks is one
error line where the pods run (a warning where the topology is only checked), GPUs it lacks one warning that
names the CPU fallback; and a topology with an unknown engine is that one error, not the other engine's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from maskrcnn_launcher.errors import TopologyError
from maskrcnn_launcher.hostcheck import cpu_fallback_warning, visible_gpus
from maskrcnn_launcher.topology import load_topology, parse_topology
from topologies import CPU_DDP_TOPOLOGY

from .conftest import clean_env


@pytest.mark.parametrize("engine", ["dpp", "pipe line", "DDP", 5])
def test_an_unknown_engine_is_the_one_problem_reported(engine: object) -> None:
    """The sections' rules depend on the engine: a typo must not add the other engine's errors (stages missing,
    workers without a stage)."""
    with pytest.raises(TopologyError) as caught:
        parse_topology({"engine": engine, "workers": [{"devices": 0}, {"devices": 0}]}, "t.yaml")
    assert len(caught.value.errors) == 1 and caught.value.errors[0].startswith("t.yaml: engine: "), caught.value.errors


def test_an_unknown_engine_close_to_a_known_one_is_named() -> None:
    with pytest.raises(TopologyError, match=r"engine: 'dpp' \(did you mean 'ddp'\?\) is not one of pipeline, ddp"):
        parse_topology({"engine": "dpp"}, "t.yaml")


def test_the_other_sections_are_still_checked_beside_an_unknown_engine() -> None:
    with pytest.raises(TopologyError) as caught:
        parse_topology({"engine": "dpp", "network": {"master_port": 0}}, "t.yaml")
    assert [e.split(": ")[1] for e in caught.value.errors] == ["engine", "network.master_port"]


@pytest.mark.parametrize("name", ["a/b", "x" * 16, "eth 0", "." * 2, ""])
def test_an_interface_name_no_host_can_have_is_refused_by_the_topology(name: str) -> None:
    with pytest.raises(TopologyError, match="network.interface"):
        parse_topology({"engine": "ddp", "network": {"interface": name}}, "t.yaml")


def test_visible_gpus_counts_the_driver_s_devices_narrowed_by_cuda_visible_devices(tmp_path: Path) -> None:
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"):
        (tmp_path / name).touch()
    assert visible_gpus({}, tmp_path) == 2
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "1"}, tmp_path) == 1
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, tmp_path) == 0
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "-1"}, tmp_path) == 0
    (tmp_path / "dxg").touch()  # WSL: GPUs behind /dev/dxg have no nodes of their own; cannot tell
    assert visible_gpus({}, tmp_path) is None
    assert visible_gpus({}, tmp_path / "none") is None


def test_the_packaged_ddp_topology_on_a_host_without_gpus_names_the_cpu_fallback() -> None:
    ddp = load_topology("ddp")
    line = cpu_fallback_warning(ddp, range(3), gpus=0)
    assert line is not None
    assert "ddp.yaml asks for 12 GPU(s) on 3 pods" in line and "12 rank(s)" in line and "CPU over gloo" in line
    assert "devices: 0" in line  # what to use instead
    assert cpu_fallback_warning(ddp, [1], gpus=0) is not None and "this pod" in cpu_fallback_warning(ddp, [1], 0)
    assert cpu_fallback_warning(ddp, range(3), gpus=4) is None  # a GPU host: nothing to say
    assert cpu_fallback_warning(ddp, range(3), gpus=None) is None  # cannot tell: say nothing
    assert cpu_fallback_warning(parse_topology({"engine": "ddp"}), [0], gpus=0) is None  # asks for none


def run_launcher(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "maskrcnn_launcher", *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env or clean_env(), timeout=60)


NO_SUCH_INTERFACE = CPU_DDP_TOPOLOGY.replace("interface: lo", "interface: nosuchif0")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_an_interface_this_host_lacks_is_refused_where_the_pods_run_and_warned_where_checked(tmp_path: Path) -> None:
    topology = tmp_path / "t.yaml"
    topology.write_text(NO_SUCH_INTERFACE)
    started = tmp_path / "started"
    launch = ["launch", "--topology", str(topology), "--role", "master", "--trainer-cmd", f"touch {started}"]
    for args in (launch, ["local", "--topology", str(topology), "--", "--epochs", "1"]):
        result = run_launcher(*args, "--", "--epochs", "1") if args is launch else run_launcher(*args)
        assert result.returncode == 2, result.stdout + result.stderr
        assert result.stderr.splitlines() == [
            f"error: t.yaml: network.interface 'nosuchif0' is not an interface of this host (it has "
            f"{result.stderr.split('(it has ', 1)[1].split(')')[0]}): gloo, NCCL and TensorPipe bind it for every "
            "collective; name one of these, or leave network.interface out"
        ], result.stderr
        assert "lo" in result.stderr and not started.exists()  # nothing started
    checked = run_launcher("validate", "--topology", str(topology))
    assert checked.returncode == 0 and checked.stdout.startswith("ok: t.yaml")
    assert checked.stderr.startswith("warning: t.yaml: network.interface 'nosuchif0' is not an interface of this host")
    assert "fine if the pods' hosts have it" in checked.stderr


GPU_DDP_TOPOLOGY = CPU_DDP_TOPOLOGY.replace("{devices: 0}", "{devices: 1}") + "master: {devices: 1}\n"


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_local_warns_once_that_a_gpu_topology_runs_on_the_cpu_here(tmp_path: Path) -> None:
    """Every pod of `local` runs on this host: the runner warns once, and its pods' launchers do not again."""
    (tmp_path / "t.yaml").write_text(GPU_DDP_TOPOLOGY)
    env = {**clean_env(), "CUDA_VISIBLE_DEVICES": "", "MASKRCNN_TRAINER_CMD": f"{sys.executable} -c pass"}
    result = run_launcher("local", "--topology", str(tmp_path / "t.yaml"), "--wait-timeout", "60", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    warnings = [line for line in (result.stdout + result.stderr).splitlines() if "warning: t.yaml asks for" in line]
    assert warnings == [
        "warning: t.yaml asks for 3 GPU(s) on 3 pods (devices: 1, 1, 1) and this host has none: torchrun starts "
        "1+1+1 = 3 rank(s) all the same, each on the CPU over gloo (--device auto); for CPU training use a "
        "topology with devices: 0"
    ], result.stdout + result.stderr
