"""`maskrcnn-launch status` through its API client, against a real HTTP server that answers like the
Kubernetes API.

The server (fake_api.py, the `cluster` fixture of conftest.py) speaks the few endpoints the command uses
with the API's own JSON shapes and Status errors; the real `kubernetes` client talks to it through a
kubeconfig file, so config loading, URLs, query parameters, deserialisation and error mapping are all
exercised.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

pytest.importorskip("kubernetes")

from maskrcnn_launcher.cli import main  # noqa: E402
from maskrcnn_launcher.status import (  # noqa: E402
    ClusterConfigError,
    ClusterPermissionError,
    ClusterUnreachableError,
    NamespaceNotFoundError,
    ReleaseNotFoundError,
    connect,
    release_status,
    render_status,
)

from .conftest import MASTER_LOG, PREFIX, api_jobset, api_jobset_pod, api_pod  # noqa: E402
from .fake_api import FakeCluster, write_kubeconfig  # noqa: E402


def _healthy(state: FakeCluster) -> None:
    state.pods["ml"] = [
        # Listed out of order, with another release's pod and the helm test pod that must not show.
        api_pod(f"{PREFIX}-worker-1", node="node-c"),
        api_pod(f"{PREFIX}-master-0", node="node-a"),
        api_pod(f"{PREFIX}-worker-0", node="node-b"),
        api_pod("other-maskrcnn-dist-master-0", release="other"),
        api_pod(f"{PREFIX}-test-master", component="test", phase="Succeeded"),
    ]
    state.logs[f"{PREFIX}-master-0"] = MASTER_LOG


def _run_cli(*args: str) -> Any:
    return CliRunner().invoke(main, ["status", *args], catch_exceptions=False)


def test_healthy_release_table_and_json(cluster: tuple[FakeCluster, str], tmp_path: Path):
    state, url = cluster
    _healthy(state)
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", url)

    result = _run_cli("--release", "demo", "--kubeconfig", str(kubeconfig))  # namespace from the context
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "release demo in namespace ml: 3 pods, 3 running"
    assert lines[1].split() == ["POD", "ROLE", "RANK", "PHASE", "RESTARTS", "NODE"]
    assert [line.split() for line in lines[2:5]] == [
        [f"{PREFIX}-master-0", "master", "0", "Running", "0", "node-a"],
        [f"{PREFIX}-worker-0", "worker", "1", "Running", "0", "node-b"],
        [f"{PREFIX}-worker-1", "worker", "2", "Running", "0", "node-c"],
    ]
    assert lines[5] == "progress: step 20/150 (13%)  loss 1.234  images/s 2.5"
    assert len(lines) == 6
    log_request = next(r for r in state.requests if r.endswith("/log") or "/log?" in r)
    assert "tailLines=200" in log_request and "container=trainer" in log_request

    result = _run_cli("--release", "demo", "--kubeconfig", str(kubeconfig), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["release"] == "demo" and data["namespace"] == "ml"
    assert [(p["name"], p["role"], p["rank"], p["phase"], p["restarts"]) for p in data["pods"]] == [
        (f"{PREFIX}-master-0", "master", 0, "Running", 0),
        (f"{PREFIX}-worker-0", "worker", 1, "Running", 0),
        (f"{PREFIX}-worker-1", "worker", 2, "Running", 0),
    ]
    assert data["progress"]["step"] == 20 and data["progress"]["total"] == 150
    assert data["progress"]["loss"] == pytest.approx(1.234)
    assert data["progress"]["images_per_s"] == pytest.approx(2.5)
    assert data["progress_note"] is None


def test_restarts_and_pending_pod(cluster: tuple[FakeCluster, str], tmp_path: Path):
    state, url = cluster
    state.pods["ml"] = [
        api_pod(f"{PREFIX}-master-0", restarts=2),
        api_pod(f"{PREFIX}-worker-0", restarts=5, waiting="CrashLoopBackOff", node="node-b"),
        api_pod(f"{PREFIX}-worker-1", phase="Pending", node=None),
    ]
    # The restarted master resumed and has not printed a train line yet.
    state.logs[f"{PREFIX}-master-0"] = "INFO resumed from ckpt_00000020.pt at step 20 (epoch 1, batch 4)\n"
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", url)

    connection = connect(kubeconfig)  # the caller's own client, as the CLI passes it
    try:
        status = release_status("demo", "ml", api=connection.api, timeout=5)
    finally:
        connection.close()
    assert [(p.rank, p.phase, p.restarts, p.node, p.reason) for p in status.pods] == [
        (0, "Running", 2, "node-a", None),
        (1, "Running", 5, "node-b", "CrashLoopBackOff"),
        (2, "Pending", 0, None, None),
    ]
    text = render_status(status)
    lines = text.splitlines()
    assert lines[0] == "release demo in namespace ml: 3 pods, 1 running"
    assert lines[3].split() == [f"{PREFIX}-worker-0", "worker", "1", "Running", "(CrashLoopBackOff)", "5", "node-b"]
    assert lines[4].split() == [f"{PREFIX}-worker-1", "worker", "2", "Pending", "0", "-"]
    assert lines[5] == f"progress: none (no train step in the last 200 log lines of {PREFIX}-master-0)"

    # A master still being scheduled has no log to read: say so, and do not ask for one.
    state.pods["ml"][0] = api_pod(f"{PREFIX}-master-0", phase="Pending", node=None)
    state.requests.clear()
    status = release_status("demo", "ml", kubeconfig=kubeconfig, timeout=5)
    assert status.progress is None
    assert status.progress_note == f"master pod {PREFIX}-master-0 has not started (Pending)"
    assert not any("/log" in r for r in state.requests)


def test_log_not_readable_is_a_note_not_a_failure(cluster: tuple[FakeCluster, str], tmp_path: Path):
    state, url = cluster
    _healthy(state)
    state.forbidden.add("get log")
    status = release_status("demo", "ml", kubeconfig=write_kubeconfig(tmp_path / "kubeconfig", url), timeout=5)
    assert len(status.pods) == 3 and status.progress is None
    assert status.progress_note.startswith(f"no permission: cannot get pods/log of {PREFIX}-master-0 in namespace ml")


def test_no_such_release(cluster: tuple[FakeCluster, str], tmp_path: Path):
    state, url = cluster
    _healthy(state)
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", url)
    with pytest.raises(ReleaseNotFoundError, match=r"no pods of release 'nope' in namespace ml .*helm list -n ml"):
        release_status("nope", "ml", kubeconfig=kubeconfig, timeout=5)

    result = _run_cli("--release", "nope", "--kubeconfig", str(kubeconfig), "-n", "ml")
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and result.output.startswith("error: no pods of release 'nope'")

    with pytest.raises(NamespaceNotFoundError, match=r"^namespace missing does not exist$"):
        release_status("demo", "missing", kubeconfig=kubeconfig, timeout=5)


def test_forbidden_names_verb_and_resource(cluster: tuple[FakeCluster, str], tmp_path: Path):
    state, url = cluster
    _healthy(state)
    state.forbidden.add("list pods")
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", url)
    with pytest.raises(ClusterPermissionError, match=r'^no permission: cannot list pods in namespace ml \(.*"alice"'):
        release_status("demo", "ml", kubeconfig=kubeconfig, timeout=5)

    result = _run_cli("--release", "demo", "--kubeconfig", str(kubeconfig))
    assert result.exit_code == 2
    assert result.output.startswith("error: no permission: cannot list pods in namespace ml")
    assert result.output.count("\n") == 1


def test_unreachable_server_fails_fast(tmp_path: Path):
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{port}")
    started = time.monotonic()
    with pytest.raises(
        ClusterUnreachableError, match=rf"^cannot reach the Kubernetes API at http://127.0.0.1:{port}: "
    ):
        release_status("demo", "ml", kubeconfig=kubeconfig, timeout=600)
    assert time.monotonic() - started < 60  # refused at once, not retried until the 600 s timeout

    result = _run_cli("--release", "demo", "--kubeconfig", str(kubeconfig))
    assert result.exit_code == 2
    assert "Connection refused" in result.output and result.output.count("\n") == 1


def test_unresponsive_server_times_out(tmp_path: Path):
    # Accepts connections, never answers: the read timeout bounds the wait.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{sock.getsockname()[1]}")
        started = time.monotonic()
        with pytest.raises(ClusterUnreachableError, match=r"timed out"):
            release_status("demo", "ml", kubeconfig=kubeconfig, timeout=0.5)
        assert time.monotonic() - started < 60  # the 0.5 s read timeout, not the server's forever


def test_no_cluster_configuration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(ClusterConfigError, match=r"^no cluster configuration: no kubeconfig at .*\.kube/config"):
        connect()

    result = _run_cli("--release", "demo")
    assert result.exit_code == 2
    assert result.output.startswith("error: no cluster configuration") and result.output.count("\n") == 1

    result = _run_cli("--release", "demo", "--kubeconfig", str(tmp_path / "absent"))
    assert result.exit_code == 2
    assert result.output == f"error: --kubeconfig {tmp_path / 'absent'} does not exist\n"


def test_default_kubeconfig_and_namespace(cluster: tuple[FakeCluster, str], tmp_path: Path, monkeypatch):
    state, url = cluster
    state.pods["default"] = [api_pod(f"{PREFIX}-master-0")]
    state.logs[f"{PREFIX}-master-0"] = MASTER_LOG
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", url, namespace=None)))
    connection = connect()
    assert connection.namespace == "default" and connection.server == url
    connection.close()
    result = _run_cli("--release", "demo")
    assert result.exit_code == 0, result.output
    assert result.output.startswith("release demo in namespace default: 1 pods, 1 running")


# -- JobSet releases -------------------------------------------------------------------------------


def test_jobset_release_running_after_a_group_restart(cluster: tuple[FakeCluster, str], tmp_path: Path):
    state, url = cluster
    state.jobsets = {"ml": [api_jobset(restarts=1)]}
    old_master = api_jobset_pod("master", 0, attempt=0)
    old_master["metadata"]["deletionTimestamp"] = "2025-01-01T10:00:00Z"
    new_master = api_jobset_pod("master", 0, attempt=1)
    state.pods["ml"] = [api_jobset_pod("workers", 1, 1), old_master, api_jobset_pod("workers", 0, 1), new_master]
    state.logs[old_master["metadata"]["name"]] = "train step 3/150 loss 9.0\n"
    state.logs[new_master["metadata"]["name"]] = MASTER_LOG
    result = _run_cli("--release", "demo", "--kubeconfig", str(write_kubeconfig(tmp_path / "kubeconfig", url)))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "release demo in namespace ml: 4 pods, 3 running"
    assert lines[1] == f"jobset {PREFIX}: Running, restarts 1 of 3"
    rows = [line.split() for line in lines[3:7]]
    assert [(r[1], r[2]) for r in rows] == [("master", "0"), ("master", "0"), ("worker", "1"), ("worker", "2")]
    assert rows[0][0] == old_master["metadata"]["name"] and "(Terminating)" in lines[3]
    assert lines[7] == "progress: step 20/150 (13%)  loss 1.234  images/s 2.5", "the newest attempt's master"


def test_jobset_release_completed(cluster: tuple[FakeCluster, str], tmp_path: Path):
    state, url = cluster
    state.jobsets = {"ml": [api_jobset(condition=("Completed", "AllJobsCompleted", "jobset completed successfully"))]}
    master = api_jobset_pod("master", 0, phase="Succeeded")
    state.pods["ml"] = [master]  # the workers' Job was deleted when the JobSet completed
    state.logs[master["metadata"]["name"]] = MASTER_LOG
    status = release_status("demo", "ml", kubeconfig=write_kubeconfig(tmp_path / "kubeconfig", url), timeout=5)
    assert status.jobset is not None and (status.jobset.state, status.jobset.reason) == (
        "Completed",
        "AllJobsCompleted",
    )
    assert [(p.role, p.rank, p.phase, p.reason, p.restart_attempt) for p in status.pods] == [
        ("master", 0, "Succeeded", "Completed", 0)
    ]
    assert status.progress is not None and status.progress.step == 20
    text = render_status(status)
    assert text.splitlines()[1] == (
        f"jobset {PREFIX}: Completed (AllJobsCompleted: jobset completed successfully), restarts 0 of 3"
    )
    assert json.loads(render_status(status, as_json=True))["jobset"]["state"] == "Completed"


def test_jobset_release_failed_on_a_user_error(cluster: tuple[FakeCluster, str], tmp_path: Path):
    state, url = cluster
    message = f"applying FailJobSet failure policy action (first failed job: {PREFIX}-master-0)"
    state.jobsets = {"ml": [api_jobset(condition=("Failed", "FailJobSetFailurePolicyAction", message))]}
    master = api_jobset_pod("master", 0, phase="Failed")
    state.pods["ml"] = [master]
    state.logs[master["metadata"]["name"]] = "error: /data/broken/train/annotations.json: not valid JSON\n"
    result = _run_cli("--release", "demo", "--kubeconfig", str(write_kubeconfig(tmp_path / "kubeconfig", url)))
    lines = result.output.splitlines()
    assert lines[1] == f"jobset {PREFIX}: Failed (FailJobSetFailurePolicyAction: {message}), restarts 0 of 3"
    assert lines[-1].startswith("progress: none (no train step in the last 200 log lines of")


def test_jobset_release_queued_without_pods(cluster: tuple[FakeCluster, str], tmp_path: Path):
    """Kueue holds a JobSet suspended until it admits it: no pods yet, which is not 'no such release'."""
    state, url = cluster
    state.jobsets = {"ml": [api_jobset(suspend=True)]}
    status = release_status("demo", "ml", kubeconfig=write_kubeconfig(tmp_path / "kubeconfig", url), timeout=5)
    assert status.pods == [] and status.jobset.state == "Suspended"
    assert "waiting for admission by a queue" in status.progress_note
    assert render_status(status).splitlines()[:2] == [
        "release demo in namespace ml: 0 pods, 0 running",
        f"jobset {PREFIX}: Suspended, restarts 0 of 3",
    ]
    state.jobsets = {"ml": []}
    with pytest.raises(ReleaseNotFoundError):
        release_status("demo", "ml", kubeconfig=write_kubeconfig(tmp_path / "kubeconfig", url), timeout=5)


def test_jobset_not_readable_still_shows_the_pods(cluster: tuple[FakeCluster, str], tmp_path: Path):
    state, url = cluster
    state.jobsets = {"ml": [api_jobset()]}
    state.forbidden.add("list jobsets")
    state.pods["ml"] = [api_jobset_pod("master", 0), api_jobset_pod("workers", 0)]
    status = release_status("demo", "ml", kubeconfig=write_kubeconfig(tmp_path / "kubeconfig", url), timeout=5)
    assert status.jobset is None and status.jobset_note.startswith("no permission: cannot list jobsets.jobset.x-k8s.io")
    assert [(p.role, p.rank) for p in status.pods] == [("master", 0), ("worker", 1)]
    assert render_status(status).splitlines()[1].startswith("jobset: not readable (no permission")


def test_jobset_pod_rank_from_its_host_name(cluster: tuple[FakeCluster, str], tmp_path: Path):
    """Without the controllers' labels (a hand-made JobSet), the host name still gives the rank."""
    state, url = cluster
    state.jobsets = {"ml": []}
    pod = api_jobset_pod("workers", 1)
    for key in ("jobset.sigs.k8s.io/replicatedjob-name", "jobset.sigs.k8s.io/job-index"):
        del pod["metadata"]["labels"][key]
    state.pods["ml"] = [pod]
    status = release_status("demo", "ml", kubeconfig=write_kubeconfig(tmp_path / "kubeconfig", url), timeout=5)
    assert [(p.role, p.rank) for p in status.pods] == [("worker", 2)]
