"""Master + two stage workers as real processes on localhost (CPU, one thread each)."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from maskrcnn_launcher.peers import free_port as pick_free_port

from ...disk import drop_checkpoints
from . import tripwires
from .pipeline_procs import spawn, stop_all

pytestmark = [pytest.mark.slow, pytest.mark.timeout(720)]

# The smallest images make_batch's rectangles fit (and BatchNorm's deepest map has 2x2 values per image).
SIZE = 64


def run_job(tmp: Path, port: int, scenario: str, timeout: float, replicas=(1, 1), **extra) -> tuple[int, str, float]:
    """Start the master and both workers; return the master's exit code, its log and its run time."""
    common = {"port": port, "out": str(tmp), "replicas": list(replicas), "size": SIZE, **extra}
    procs = []
    try:
        procs.append(spawn("master", {**common, "scenario": scenario}, tmp))
        procs += [spawn("worker", {**common, "index": i}, tmp) for i in range(2)]
        started = time.monotonic()
        code = procs[0].wait(timeout=timeout)
        elapsed = time.monotonic() - started
        for proc in procs[1:]:
            proc.wait(timeout=30)
        return code, (tmp / "master-0.log").read_text(), elapsed
    finally:
        stop_all(procs)


@pytest.fixture(scope="module")
def compared(tmp_path_factory) -> Iterator[dict]:
    tmp = tmp_path_factory.mktemp("compare")
    # Nothing here waits out --rpc-timeout: a long one keeps a busy machine from failing a healthy call.
    code, log, _ = run_job(tmp, pick_free_port(), "compare", timeout=600, micro_batches=2, rpc_timeout=120)
    assert code == 0, log
    yield {**torch.load(tmp / "result.pt", weights_only=False), "tripwires": tripwires.tripped(tmp / "tripwires")}
    drop_checkpoints(tmp)


def _max_diff(a: dict, b: dict, buffers: bool = True) -> float:
    keys = [k for k in a if buffers or not any(s in k for s in ("running_", "num_batches_tracked"))]
    return max(float((a[k].float() - b[k].float()).abs().max()) if a[k].numel() else 0.0 for k in keys)


def test_m1_equals_single_process(compared) -> None:
    # Same seeds, same weights, same draws (StepSeeder at micro 0); stage 2 backpropagates into the features
    # it received, stage 1 from their gradients: the same sums as one process's backward, bit for bit.
    assert compared["m1_losses"] == compared["local_losses"]
    for key, expected in compared["local_state"]["model"].items():
        assert torch.equal(compared["m1_state"]["model"][key], expected), key


def test_m2_close_to_single_process(compared) -> None:
    # M=2: RPN/RoI sampling normalises per micro-batch and BatchNorm sees half the batch, so the
    # terms differ; the first step's weights start equal, so the loss is close, not equal. Seen at 96
    # px: total loss 10.73 vs 10.97, parameters 4e-3 apart after two steps at lr 0.01.
    first, expected = compared["m2_losses"][0], compared["local_losses"][0]
    for name in expected:
        assert first[name] == pytest.approx(expected[name], rel=0.25, abs=0.05), name
    assert _max_diff(compared["m2_state"]["model"], compared["local_state"]["model"], buffers=False) < 2e-2


def test_m2_equals_local_accumulating_the_same_micro_batches(compared) -> None:
    # The exact reference for M=2 (pipeline_scenarios._local_accumulating): same micro-batches, same
    # seeds, same weights. Only summation order may differ.
    for got, expected in zip(compared["m2_losses"], compared["local_m2_losses"], strict=True):
        assert got.keys() == expected.keys()
        for name in expected:
            assert got[name] == pytest.approx(expected[name], rel=1e-5, abs=1e-6), name
    got, expected = compared["m2_state"]["model"], compared["local_m2_state"]["model"]
    for key in expected:
        torch.testing.assert_close(got[key].float(), expected[key].float(), rtol=1e-5, atol=1e-6, msg=key)


def test_stage_schedulers_follow_the_local_schedule(compared) -> None:
    # Warm-up then a decay step: every stage's rate after each step equals the local engine's.
    local = compared["sched_local_lrs"]
    assert len(set(local)) == len(local), f"the test schedule must change at every step: {local}"
    for step, (stages, expected) in enumerate(zip(compared["sched_pipe_lrs"], local, strict=True)):
        assert stages == pytest.approx([expected] * len(stages), rel=1e-12), f"after step {step}"
    got, expected = compared["sched_pipe_state"], compared["sched_local_state"]
    assert got["scheduler"]["last_epoch"] == expected["scheduler"]["last_epoch"]
    assert _max_diff(got["model"], expected["model"]) < 1e-5


def test_replicas_stay_identical_and_match_one_replica(compared) -> None:
    for checksums in compared["r2_checksums"]:
        assert len(set(checksums)) == 1
    # Same micro-batches on identical weights: the losses match; the gradients differ only in the
    # order of summation (seen: 1.5e-8). BatchNorm running statistics differ by design: R=2 averages
    # the replicas' statistics, R=1 updates one set micro-batch after micro-batch.
    steps = len(compared["m2_losses"])
    for got, expected in zip(compared["r2_losses"][:steps], compared["m2_losses"]):
        for name in expected:
            assert got[name] == pytest.approx(expected[name], abs=1e-5), name
    assert _max_diff(compared["r2_state"]["model"], compared["m2_state"]["model"], buffers=False) < 1e-6


def test_1f1b_equals_gpipe_over_rpc(compared) -> None:
    assert compared["m4_1f1b_losses"] == compared["m4_gpipe_losses"]
    got, expected = compared["m4_1f1b_state"], compared["m4_gpipe_state"]
    for key, value in expected["model"].items():
        assert torch.equal(got["model"][key], value), key
    momenta = {i: s["momentum_buffer"] for i, s in expected["optimizer"]["state"].items()}
    assert momenta and got["optimizer"]["state"].keys() == momenta.keys()
    for i, value in momenta.items():
        assert torch.equal(got["optimizer"]["state"][i]["momentum_buffer"], value), i
    # What each schedule kept in flight per stage: 1F1B at most the stages after it, GPipe every micro-batch.
    for schedule, held in (("1f1b", [2.0, 1.0]), ("gpipe", [4.0, 4.0])):
        metrics = compared[f"m4_{schedule}_metrics"]
        assert [metrics[f"stage{s}/peak_in_flight"] for s in (1, 2)] == held, schedule


def test_no_process_used_rrefs_distributed_autograd_or_the_distributed_optimizer(compared) -> None:
    """Every process of the session (master, worker1, worker2) ran with tripwires on each of them
    (tripwires.py): its record exists, and is empty."""
    assert compared["tripwires"] == {"master-0.log": [], "worker-0.log": [], "worker-1.log": []}


def test_every_process_ran_under_the_device_map_guard(compared) -> None:
    # tests/conftest.py turns the guard on; each process installed it before joining RPC (runtime.join_rpc),
    # so every result of this whole session was walked as a device-map agent walks it.
    assert compared["guarded"] == {"worker1": True, "worker2": True, "master": True}


def test_closed_engines_leave_no_stage_host_behind(compared) -> None:
    assert compared["hosts_left"] == {"worker1": 0, "worker2": 0}


def test_loss_falls(compared) -> None:
    losses = [sum(d.values()) for d in compared["r2_losses"]]
    assert losses[-1] < losses[0], losses


def test_predict_through_pipeline_equals_monolithic(compared) -> None:
    got, expected = compared["pipe_pred"], compared["local_pred"]
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.keys() == e.keys()
        for key in e:
            assert torch.equal(g[key], e[key]), key


def test_validation_losses_match_and_change_nothing(compared) -> None:
    for name, value in compared["local_val"].items():
        assert float(compared["pipe_val"][name]) == pytest.approx(float(value), abs=1e-6), name
    assert compared["after_val_equal"]


def test_metrics_count_bytes_and_busy_time(compared) -> None:
    metrics = compared["metrics"]
    assert metrics["link/worker1->worker2/bytes"] > 100_000  # FPN features of 4 images at 64 px: 1.4 MB
    assert metrics["link/worker2->worker1/grad_bytes"] > 0
    assert 0.0 <= metrics["pipeline/bubble_fraction"] <= 1.0
    assert metrics["stage1/busy_s"] > 0 and metrics["stage2/busy_s"] > 0


def _records(path: Path, kind: str) -> list[dict]:
    if not path.is_file():
        return []
    return [r for r in map(json.loads, path.read_text().splitlines()) if r.get("kind") == kind]


@pytest.mark.real_processes  # SIGSTOP freezes the process it is sent to: worker 2 itself
@pytest.mark.parametrize("fault", ["killed", "frozen"])
def test_master_exits_when_worker2_dies(tmp_path, free_port, fault: str) -> None:
    """Killed: the closed connection fails the step at once. Frozen (SIGSTOP: nothing closes, as
    `docker pause` in the e2e silent-peer scenario): the step's calls time out after --rpc-timeout and
    the master leaves right then, without a further call to the frozen peer."""
    # Killed: at once (a second or two), not at --rpc-timeout (60 s): the bound of 30 s lies far from both.
    # Frozen: one --rpc-timeout (small, so as not to wait long for it, yet far above any call of a healthy
    # step here), the search for the lost peer and the exit. That no call to the frozen peer follows the
    # search (a drop in close() would wait out a second timeout) is read from the master's list of calls;
    # the clock only guards against a hang.
    timeout = 60.0 if fault == "killed" else 20.0
    out = tmp_path / "run"
    port = free_port
    common = {
        "port": port,
        "out": str(tmp_path),
        "steps": 1000,
        "output_dir": str(out),
        "rpc_timeout": timeout,
        "micro_batches": 2,
        "size": SIZE,
    }
    procs = []
    try:
        procs.append(spawn("master", {**common, "scenario": "train_cli"}, tmp_path))
        procs += [spawn("worker", {**common, "index": i}, tmp_path) for i in range(2)]
        deadline = time.monotonic() + 150
        while not _records(out / "metrics.jsonl", "train"):
            assert time.monotonic() < deadline and procs[0].poll() is None, (tmp_path / "master-0.log").read_text()
            time.sleep(0.2)
        if fault == "killed":
            procs[2].kill()  # worker2, mid-run
        else:
            procs[2].send_signal(signal.SIGSTOP)
        killed = time.monotonic()
        code = procs[0].wait(timeout=2 * timeout + 30)
        elapsed = time.monotonic() - killed
        log = (tmp_path / "master-0.log").read_text()
        assert code != 0, log
        if fault == "killed":
            assert elapsed < 30, f"master took {elapsed:.1f}s"
        assert "worker2" in log.splitlines()[-1] and "lost" in log.splitlines()[-1], log[-2000:]
        calls = (tmp_path / "calls-master.log").read_text().splitlines()
        search = len(calls) - calls[::-1].index("worker2 _ping")  # the search for the lost peer found it
        assert [c for c in calls[search:] if c.startswith("worker2 ")] == [], calls[search - 1 :]
        # worker1 notices the master is gone and exits non-zero too.
        assert procs[1].wait(timeout=timeout + 10) != 0
    finally:
        stop_all(procs)
