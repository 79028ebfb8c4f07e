"""The `jobset-elastic` scenario's parts that run without docker: the chart as the scenario renders it
under the emulated JobSet controller (a killed worker replaced alone, no restart; without
jobset.elastic the group restarts), and its checks on what a run leaves (the master's log as `status`
reads it, the world size by step, the sample record, a container's start time).
"""

from __future__ import annotations

import json

import pytest
from maskrcnn_launcher.contract import format_membership_line, format_progress_line

from e2e import checks
from e2e.checks import Failed
from e2e.cluster import ContainerState
from e2e.scenarios.chart import DDP_VALUES
from e2e.scenarios.elastic import STEPS, check_world_sizes, elastic_overlay, membership_changes


@pytest.fixture
def elastic_run(jobset_run):
    """elastic_run(enabled) -> the emulated controller over the scenario's render, started on a FakeCluster."""

    def run(enabled: bool = True):
        overlay = {**elastic_overlay(), "jobset": {"elastic": {"enabled": enabled}}}
        return jobset_run(overlay, values=DDP_VALUES)

    return run


def test_the_scenarios_jobset_replaces_a_killed_worker_alone(elastic_run):
    controller, cluster = elastic_run()
    pods = controller.pod_specs()
    assert [p.host for p in pods] == [f"e2e-maskrcnn-dist-{h}" for h in ("master-0-0", "workers-0-0", "workers-0-1")]
    for pod in pods:
        assert "--elastic" in pod.args and pod.args[pod.args.index("--max-steps") + 1] == str(STEPS), pod.args
        (data,) = [m for m in pod.mounts if m.kind == "pvc"]
        assert not data.read_only, f"{pod.host}: every rank writes its lines of the sample record"
    victim = controller.pods("workers")[1]
    cluster.exit(victim.container, 137)  # SIGKILL: counted, replaced after the back-off (long past here)
    assert controller.reconcile() is None, controller.describe()
    new = controller.pods("workers")[1]
    assert new.spec.host == victim.spec.host and new.spec.name != victim.spec.name
    assert new.container in cluster.running() and controller.attempt.jobs[1].replaced == [victim]
    cluster.exit(controller.pods("master")[0].container, 0)
    assert controller.reconcile() == "Completed" and controller.restarts == 0 and len(controller.attempts) == 1


def test_without_jobset_elastic_the_same_kill_restarts_the_group(elastic_run):
    """The mutation the scenario must catch: rendered without jobset.elastic, the JobSet restarts."""
    controller, cluster = elastic_run(enabled=False)
    assert all("--elastic" not in p.args for p in controller.pod_specs())
    cluster.exit(controller.pods("workers")[1].container, 137)
    assert controller.reconcile() is None and controller.restarts == 1 and len(controller.attempts) == 2


def _master_log(*changes: tuple[str, int, int, int], replicas: int = 3) -> str:
    lines = [format_progress_line("train", 1, STEPS, {"loss": 1.5, "world_size": 3})]
    lines += [format_membership_line(*change) for change in changes]
    lines.append(format_progress_line("train", 9, STEPS, {"loss": 1.0, "world_size": 3}))
    lines.append(f"elastic: the {replicas} replicas hold the same weights")
    return "\n".join(f"2026-11-27 14:00:00 INFO maskrcnn_dist: {line}" for line in lines)


def test_membership_changes_as_status_reads_them():
    log = _master_log(("lost", 2, 4, 2), ("joined", 2, 7, 3))
    assert membership_changes(log, rank=2) == {"lost_after_step": 4, "joined_after_step": 7}
    for wrong in (
        _master_log(("lost", 2, 4, 2)),  # never joined
        _master_log(("lost", 1, 4, 2), ("joined", 1, 7, 3)),  # another rank
        _master_log(("lost", 2, 4, 2), ("joined", 2, 5, 3), ("lost", 2, 6, 2), ("joined", 2, 7, 3)),
        _master_log(("left", 2, 4, 2), ("joined", 2, 7, 3)),  # a drain, not a loss
        _master_log(("lost", 2, 4, 2), ("joined", 2, 7, 3), replicas=2),  # the replicas never compared as 3
        "no train line at all",
    ):
        with pytest.raises(Failed):
            membership_changes(wrong, rank=2)


def _records(sizes: list[int]) -> list[dict]:
    train = [{"kind": "train", "step": s, "world_size": n} for s, n in enumerate(sizes, 1)]
    return [*reversed(train), {"kind": "val", "step": len(sizes)}]


def test_world_sizes_by_step():
    assert len(check_world_sizes(_records([3, 3, 3, 2, 2, 3]), lost_after=3, joined_after=5)) == 6
    for sizes in ([3, 3, 2, 2, 2, 3], [3, 3, 3, 2, 2, 2], [3] * 6, [3, 3, 3, 2, 3, 3]):
        with pytest.raises(Failed, match="world sizes by step"):
            check_world_sizes(_records(sizes), lost_after=3, joined_after=5)
    with pytest.raises(Failed):
        check_world_sizes(_records([3] * 6), lost_after=3, joined_after=3)  # never on 2 ranks


def _sample_record(run_dir, lines_by_rank: dict[int, list[tuple[int, list[int]]]]) -> None:
    folder = run_dir / "samples"
    folder.mkdir(parents=True, exist_ok=True)
    for rank, lines in lines_by_rank.items():
        records = [{"step": s, "epoch": (s - 1) // 2, "rank": rank, "image_ids": ids} for s, ids in lines]
        text = "".join(json.dumps(r) + "\n" for r in records)
        (folder / f"rank{rank}.jsonl").write_text(text)


def test_every_image_once_an_epoch_by_the_sample_record(tmp_path):
    ids = list(range(100, 108))  # two epochs of 2 steps, 2 images a step on each of 2 ranks
    whole = {0: [(1, [100, 101]), (2, [104, 105]), (3, [107, 106]), (4, [101, 100])],
             1: [(1, [102, 103]), (2, [106, 107]), (3, [105, 104]), (4, [103, 102])]}  # fmt: skip
    _sample_record(tmp_path, whole)
    checks.check_each_image_once(tmp_path, ids, range(2))
    for rank1, error in (
        ([(1, [102, 103]), (3, [105, 104]), (4, [103, 102])], r"epoch 0: 2 train images missing .*: \[106, 107\]"),
        ([(1, [102, 103]), (2, [106, 107]), (3, [105, 104]), (4, [103, 100])], r"epoch 1: images \[100\] trained on"),
        ([(1, [102, 103]), (2, [106, 107]), (3, [105, 104]), (4, [103, 999])], r"epoch 1: images \[999\] are not in"),
        (
            [(1, [102, 103]), (2, [106, 107]), (3, [105, 104]), (4, [103, 102]), (4, [103, 102])],
            r"epoch 1: images \[102, 103\]",
        ),
    ):
        _sample_record(tmp_path, {1: rank1})
        with pytest.raises(Failed, match=error):
            checks.check_each_image_once(tmp_path, ids, range(2))
    _sample_record(tmp_path, whole)
    with pytest.raises(Failed, match="epoch 2: 8 train images missing"):
        checks.check_each_image_once(tmp_path, ids, range(3))  # an epoch with no line at all


def test_a_containers_start_time():
    state = ContainerState("running", 0, "2026-11-27T14:00:01.123456789Z", "0001-01-01T00:00:00Z", 7)
    assert state.started_time.isoformat() == "2026-11-27T14:00:01.123456+00:00"
    assert ContainerState("exited", 0, "2026-11-27T14:00:01.5Z", "", 0).started_time.microsecond == 500000
