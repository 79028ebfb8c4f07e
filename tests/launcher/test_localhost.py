"""Three `maskrcnn-launch launch` processes on loopback (master, worker 0, worker 1) with a stand-in trainer.

The stand-in plays the part torch plays in the real run: the master's trainer opens MASTER_PORT (as
rank 0's TCPStore does), and each worker's trainer connects to it and says its rank. The workers
are started first, so their launchers must wait for the master's port before they exec. Each
stand-in prints its environment as JSON; the test checks ranks, world size, MASTER_ADDR/PORT, the
socket interface variables and the pod plan per process, and that exec kept the launcher's PID.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from maskrcnn_launcher.contract import PodPlan

from .conftest import STAND_IN, TOPOLOGY, clean_env


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_three_launch_processes_on_localhost(tmp_path: Path, free_port: int) -> None:
    (tmp_path / "stand_in.py").write_text(STAND_IN)
    (tmp_path / "topology.yaml").write_text(TOPOLOGY)
    port = free_port
    launcher = [sys.executable, "-m", "maskrcnn_launcher", "launch", "--topology", str(tmp_path / "topology.yaml")]
    common = ["--trainer-cmd", f"{sys.executable} {tmp_path / 'stand_in.py'}", "--wait-timeout", "60"]
    # Three ways to say who you are: flags, environment variables, flags again.
    worker0_env = {
        "MASKRCNN_ROLE": "worker",
        "MASKRCNN_INDEX": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    specs = {
        "worker1": (launcher + common + ["--", "--steps", "2"], worker0_env),
        "worker2": (
            launcher
            + ["--role", "worker", "--index", "1", "--master-addr", "127.0.0.1", "--master-port", str(port)]
            + common
            + ["--", "--steps", "2"],
            {},
        ),
        "master": (launcher + ["--role", "master", "--master-port", str(port)] + common + ["--", "--steps", "2"], {}),
    }
    procs: dict[str, subprocess.Popen[str]] = {}
    try:
        for name, (argv, extra) in specs.items():
            if name == "master":
                time.sleep(1.0)  # the workers are already waiting for the master's port
            procs[name] = subprocess.Popen(
                argv, env={**clean_env(), **extra}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        outputs = {}
        for name, proc in procs.items():
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, f"{name} exited {proc.returncode}:\n{err}"
            outputs[name] = (json.loads(out.strip().splitlines()[-1]), err, proc.pid)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)

    expected = {"master": 0, "worker1": 1, "worker2": 2}
    for name, (report, err, pid) in outputs.items():
        env = report["env"]
        assert report["pid"] == pid, "the trainer must replace the launcher (exec), so signals reach it"
        assert report["argv"] == ["--steps", "2"]
        assert env["RANK"] == str(expected[name]) and env["WORLD_SIZE"] == "3"
        assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == ("0", "1")
        assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"] == str(port)
        assert env["TP_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "lo"
        plan = PodPlan.from_json(env["MASKRCNN_POD_PLAN"])
        assert (plan.rpc_name, plan.rank, plan.world_size, plan.master_port) == (name, expected[name], 3, port)
        assert [s.devices for s in plan.stages] == [("cpu",), ("cpu", "cpu")]
        assert plan.device_maps == {} and plan.backend == "gloo"
        if name != "master":
            assert f"waiting for master 127.0.0.1:{port}" in err, err
    assert outputs["master"][0]["hello"] == [1, 2]
    assert "waiting" not in outputs["master"][1]  # the master never waits for its own port
    worker2 = PodPlan.from_json(outputs["worker2"][0]["env"]["MASKRCNN_POD_PLAN"])
    assert [s.devices for s in worker2.stages if s.rpc_name == worker2.rpc_name] == [("cpu", "cpu")]
