"""`status`'s reading and rendering, over the API's JSON as plain data: no API server, no kubernetes client.

Pod and JobSet objects come from conftest (the shapes the API server returns for a release of the
chart); the progress line is read back from what the trainer's formatters write.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from maskrcnn_launcher.contract import (
    format_membership_line,
    format_progress_bar,
    format_progress_line,
    parse_membership_line,
    parse_progress_line,
)
from maskrcnn_launcher.status.report import (
    JobSetStatus,
    PodStatus,
    Progress,
    ReleaseStatus,
    jobset_status,
    latest_progress,
    log_container,
    not_started,
    pod_status,
    read_pods,
    render_status,
)

from .conftest import MASTER_LOG, PREFIX, api_jobset, api_jobset_pod, api_pod


def test_pod_status_of_a_statefulset_pod() -> None:
    assert pod_status(api_pod(f"{PREFIX}-worker-1", restarts=4, waiting="CrashLoopBackOff", node="n")) == PodStatus(
        f"{PREFIX}-worker-1", "worker", 2, "Running", 4, "n", "CrashLoopBackOff", None
    )
    pending = api_pod(f"{PREFIX}-master-0", phase="Pending", node=None)
    assert pod_status(pending) == PodStatus(f"{PREFIX}-master-0", "master", 0, "Pending", 0, None, None, None)


def test_pod_status_reasons_terminating_and_a_pod_without_status() -> None:
    done = api_jobset_pod("workers", 0, attempt=1, phase="Succeeded")
    status = pod_status(done)
    assert (status.role, status.rank, status.reason, status.restart_attempt) == ("worker", 1, "Completed", 1)
    leaving = api_pod(f"{PREFIX}-worker-0")
    leaving["metadata"]["deletionTimestamp"] = "2025-01-01T10:00:00Z"
    assert pod_status(leaving).reason == "Terminating"
    bare = {"metadata": {"name": "someone-else", "labels": {"app.kubernetes.io/component": "worker"}}}
    assert pod_status(bare) == PodStatus("someone-else", "worker", None, "Unknown", 0, None, None, None)


def test_pods_in_rank_order_and_the_newest_attempts_master() -> None:
    old, new = api_jobset_pod("master", 0, attempt=0), api_jobset_pod("master", 0, attempt=1)
    pods, master = read_pods([api_jobset_pod("workers", 1, 1), new, api_jobset_pod("workers", 0, 1), old])
    assert [(p.rank, p.restart_attempt) for p in pods] == [(0, 0), (0, 1), (1, 1), (2, 1)]
    assert master is new
    assert read_pods([api_pod(f"{PREFIX}-worker-0")]) == ([pod_status(api_pod(f"{PREFIX}-worker-0"))], None)


def test_a_master_that_never_ran_has_no_log_to_read() -> None:
    assert not_started(api_pod(f"{PREFIX}-master-0", phase="Pending")) == (
        f"master pod {PREFIX}-master-0 has not started (Pending)"
    )
    assert not_started(api_pod(f"{PREFIX}-master-0")) is None  # running
    assert not_started(api_pod(f"{PREFIX}-master-0", waiting="CrashLoopBackOff", restarts=3)) is None  # it ran
    assert not_started(api_jobset_pod("master", 0, phase="Succeeded")) is None  # terminated: its log stays


def test_the_log_is_read_from_the_trainer_container() -> None:
    pod = api_pod(f"{PREFIX}-master-0")
    assert log_container(pod) == "trainer"
    pod["spec"]["containers"] = [{"name": "sidecar"}, {"name": "trainer"}]
    assert log_container(pod) == "trainer"
    pod["spec"]["containers"] = [{"name": "main"}]
    assert log_container(pod) == "main"


def test_latest_progress_is_the_last_train_line() -> None:
    progress, note = latest_progress(MASTER_LOG, "m", 200)
    assert note is None and (progress.step, progress.total, progress.loss, progress.images_per_s) == (
        20,
        150,
        1.234,
        2.5,
    )
    assert latest_progress("val step 10/150 loss 1.4\n", "m", 50) == (
        None,
        "no train step in the last 50 log lines of m",
    )


@pytest.mark.parametrize(
    ("condition", "suspend", "expected"),
    [
        (None, False, ("Running", None, None)),
        (None, True, ("Suspended", None, None)),
        (("Completed", "AllJobsCompleted", "done"), False, ("Completed", "AllJobsCompleted", "done")),
        (("Failed", "ReachedMaxRestarts", "gave up"), False, ("Failed", "ReachedMaxRestarts", "gave up")),
    ],
)
def test_jobset_state(condition: tuple[str, str, str] | None, suspend: bool, expected: tuple[Any, ...]) -> None:
    status = jobset_status(api_jobset(restarts=2, condition=condition, suspend=suspend))
    assert (status.state, status.reason, status.message) == expected
    assert (status.name, status.restarts, status.max_restarts) == (PREFIX, 2, 3)


def test_a_condition_that_is_not_true_is_no_terminal_state() -> None:
    obj = api_jobset(condition=("Failed", "ReachedMaxRestarts", "gave up"))
    obj["status"]["conditions"][0]["status"] = "False"
    del obj["spec"]["failurePolicy"]
    assert jobset_status(obj) == JobSetStatus(PREFIX, "Running", None, None, 0, None)


def test_render_table_and_json() -> None:
    pods = [
        PodStatus(f"{PREFIX}-master-0", "master", 0, "Running", 0, "node-a"),
        PodStatus(f"{PREFIX}-worker-0", "worker", 1, "Running", 5, None, "CrashLoopBackOff"),
    ]
    jobset = JobSetStatus(PREFIX, "Failed", "FailJobSetFailurePolicyAction", "first\nfailed job", 1, 3)
    status = ReleaseStatus("demo", "ml", pods, Progress(20, 150, 1.234, 2.5, "train step 20/150"), None, jobset)
    assert render_status(status).splitlines() == [
        "release demo in namespace ml: 2 pods, 1 running",
        f"jobset {PREFIX}: Failed (FailJobSetFailurePolicyAction: first failed job), restarts 1 of 3",
        f"{'POD':{len(PREFIX) + 9}}  ROLE    RANK  PHASE                       RESTARTS  NODE",
        f"{PREFIX}-master-0  master  0     Running                     0         node-a",
        f"{PREFIX}-worker-0  worker  1     Running (CrashLoopBackOff)  5         -",
        "progress: step 20/150 (13%)  loss 1.234  images/s 2.5",
    ]
    data = json.loads(render_status(status, as_json=True))
    assert data["pods"][1]["reason"] == "CrashLoopBackOff" and data["jobset"]["max_restarts"] == 3
    quiet = ReleaseStatus("demo", "ml", [], None, "no master pod", None, "no permission: cannot list jobsets")
    assert render_status(quiet).splitlines()[1:] == [
        "jobset: not readable (no permission: cannot list jobsets)",
        "POD  ROLE  RANK  PHASE  RESTARTS  NODE",
        "progress: none (no master pod)",
    ]


# -- the progress line the trainer writes ------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "train step 12/150 loss_classifier 0.1 loss 1.2 lr 0.01 images_per_s 2.5",
            {
                "kind": "train",
                "step": 12,
                "total": 150,
                "loss_classifier": 0.1,
                "loss": 1.2,
                "lr": 0.01,
                "images_per_s": 2.5,
            },
        ),
        ("[rank 0] eval step 150/150 bbox_AP 0.12", {"kind": "eval", "step": 150, "total": 150, "bbox_AP": 0.12}),
        ("[#####.....] 3/9 loss nan lr 1e-05", {"kind": "train", "step": 3, "total": 9, "lr": 1e-05}),
        ("INFO maskrcnn_dist.train: saved ckpt_00000020.pt", None),
        ("the train step 3 failed", None),
    ],
)
def test_parse_progress_line(line: str, expected: dict[str, Any] | None):
    parsed = parse_progress_line(line)
    if expected is None:
        assert parsed is None
        return
    nan_keys = {k for k, v in parsed.items() if isinstance(v, float) and v != v}
    assert nan_keys <= {"loss"}
    assert {k: v for k, v in parsed.items() if k not in nan_keys} == expected


@pytest.mark.parametrize("kind", ["train", "val", "eval"])
def test_parse_reads_what_the_formatters_write(kind: str):
    """The trainer's console uses these formatters (metrics.MetricsWriter); the reader must read both."""
    values = {"loss_mask": 0.51234, "loss": 1.23456, "lr": 0.00125, "images_per_s": 3.0, "epoch": 1, "link/a/b": 9.0}
    line = format_progress_line(kind, 20, 40, values)
    assert line == f"{kind} step 20/40 loss_mask 0.5123 loss 1.235 lr 0.00125 images_per_s 3"
    for text in (line, format_progress_bar(20, 40, values)):
        parsed = parse_progress_line(text)
        assert parsed["kind"] == (kind if text == line else "train") and parsed["step"] == 20
        assert parsed["total"] == 40 and parsed["loss"] == pytest.approx(1.235) and parsed["images_per_s"] == 3.0
        assert "epoch" not in parsed and "link/a/b" not in parsed
    assert format_progress_bar(20, 40, {}) == "[" + "#" * 15 + "." * 15 + "] 20/40"
    assert parse_progress_line(format_progress_line(kind, 1, 2, {})) == {"kind": kind, "step": 1, "total": 2}


ELASTIC_LOG = """\
train step 10/100 loss 1.5 images/s 3 world 3
[W socket.cpp] a torn line
elastic: rank 2 lost after step 12; world size 2
train step 20/100 loss 1.2 images/s 2.1 world 2
elastic: rank 2 joined after step 25; world size 3
elastic: rank 1 left after step 27; world size 2
"""


def test_an_elastic_jobs_world_size_and_changes_of_membership() -> None:
    progress, note = latest_progress(ELASTIC_LOG, "m", 200)
    assert note is None and progress.step == 20
    assert progress.world_size == 2  # the newest change is after the last train line
    assert (progress.lost, progress.left, progress.joined) == (1, 1, 1)
    assert progress.last_change == "rank 1 left after step 27"
    status = ReleaseStatus("r", "ns", progress=progress)
    assert "world size 2  members: 1 lost, 1 left, 1 joined (newest: rank 1 left after step 27)" in render_status(
        status
    )
    # A job that never changed shows the train line's world size and no members' part.
    quiet, _ = latest_progress("train step 5/9 loss 1 world 3\n", "m", 50)
    assert quiet.world_size == 3 and "members:" not in render_status(ReleaseStatus("r", "ns", progress=quiet))


def test_membership_lines_read_back_what_the_leader_writes() -> None:
    line = format_membership_line("joined", 2, 30, 3)
    assert parse_membership_line(f"[master] 12:00:01 {line}") == {
        "event": "joined",
        "rank": 2,
        "step": 30,
        "world_size": 3,
    }
    assert parse_progress_line(format_progress_line("train", 3, 9, {"loss": 1.0, "world_size": 2}))["world"] == 2.0
    with pytest.raises(ValueError, match="restarted"):
        format_membership_line("restarted", 2, 30, 3)
