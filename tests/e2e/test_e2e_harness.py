"""The e2e harness's translation of the chart into containers (no docker needed: `make test` runs it).

What the containers of `make e2e` get must be what Kubernetes would give the pods: these tests pin
the kubelet's `$(VAR)` expansion, the downward API, DNS names and the security context mapping,
against the chart as rendered by helm; and the emulated JobSet controller's decisions (success,
group restart, fail-fast, max restarts) on a fake cluster whose containers the test makes exit.
"""

from __future__ import annotations

from pathlib import Path

import pytest

# The top-level `e2e` package is on the path: tests/e2e/conftest.py puts it there.
from e2e import checks
from e2e.cluster import SpecError, quantity_bytes
from e2e.cluster.containers import docker_run_args
from e2e.cluster.jobset_spec import parse_jobset
from e2e.cluster.pods import expand
from e2e.scenarios.bare_nodes import extract_recipe
from e2e.scenarios.chart import CPU_VALUES, DDP_CPU_OVERLAY, DDP_VALUES, render_release
from e2e.scenarios.common import expected_checkpoints

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("$(A)", "a"),
        ("x$(A)y$(B)z", "xaybz"),
        ("$(MISSING)", "$(MISSING)"),
        ("$$(A)", "$(A)"),
        ("$$", "$"),
        ("$", "$"),
        ("a$b", "a$b"),
        ("$(A", "$(A"),
        ("$()", ""),
        ("--topology=$(A)/t.yaml", "--topology=a/t.yaml"),
    ],
)
def test_expand_like_the_kubelet(text, expected):
    assert expand(text, {"A": "a", "B": "b", "": ""}.get) == expected


def test_quantities():
    assert quantity_bytes("512Mi") == 512 * 2**20
    assert quantity_bytes("2Gi") == 2 * 2**30
    assert quantity_bytes("1G") == 10**9
    assert quantity_bytes("1000") == 1000


def _ips(name: str) -> str:
    return {"e2e-maskrcnn-dist-master-0": "10.9.9.10"}.get(name, "10.9.9.99")


def test_pipeline_pods_from_the_chart(helm, tmp_path):
    release = render_release(helm, "e2e", "e2e", [CPU_VALUES], _ips)
    assert [p.name for p in release.pods] == [
        "e2e-maskrcnn-dist-master-0",
        "e2e-maskrcnn-dist-worker-0",
        "e2e-maskrcnn-dist-worker-1",
    ]
    master = release.master
    assert master.env["POD_NAME"] == "e2e-maskrcnn-dist-master-0"
    assert master.env["POD_NAMESPACE"] == "e2e"
    assert master.env["POD_IP"] == "10.9.9.10"
    assert master.fqdn == "e2e-maskrcnn-dist-master-0.e2e-maskrcnn-dist-headless.e2e.svc.cluster.local"
    # `$(MASKRCNN_TOPOLOGY)` in the pod's args, expanded from its own env, and the file is mounted there.
    assert master.args[:4] == ["launch", "--topology", "/etc/maskrcnn/topology.yaml", "--"]
    topo = next(m for m in master.mounts if m.kind == "configMap")
    assert topo.path == "/etc/maskrcnn" and "engine: pipeline" in topo.files["topology.yaml"]
    # pipeline workers do not mount the volume; the master does, read-write
    assert [m.kind for m in release.workers[0].mounts].count("pvc") == 0
    assert any(m.kind == "pvc" and not m.read_only for m in master.mounts)

    args = docker_run_args(master, "c", "net", "img:1", tmp_path, {"x": "y"})
    joined = " ".join(args)
    for expected in (
        "--hostname e2e-maskrcnn-dist-master-0",
        "--ip 10.9.9.10",
        f"--network-alias {master.fqdn}",
        "--user 10001:10001",
        "--group-add 10001",
        "--read-only",
        "--cap-drop ALL",
        "--security-opt no-new-privileges",
        f"--shm-size {512 * 2**20}",
        "-e POD_IP=10.9.9.10",
        "img:1 launch --topology /etc/maskrcnn/topology.yaml --",
    ):
        assert expected in joined, expected
    assert any(a.startswith("/tmp:") for a in args) and any(a.startswith("/home/maskrcnn:") for a in args)
    assert (tmp_path / "configmaps" / "c" / "etc_maskrcnn" / "topology.yaml").is_file()


def test_ddp_pods_mount_the_volume_read_only_on_workers(helm, tmp_path):
    overlay = tmp_path / "o.yaml"
    import yaml

    overlay.write_text(yaml.safe_dump(DDP_CPU_OVERLAY))
    release = render_release(helm, "e2e", "e2e", [DDP_VALUES, overlay], _ips)
    assert len(release.pods) == 2 and all(p.gpus == 0 for p in release.pods)
    worker_pvc = next(m for m in release.workers[0].mounts if m.kind == "pvc")
    assert worker_pvc.read_only
    args = docker_run_args(release.workers[0], "w", "net", "img:1", tmp_path, {})
    assert any(a.startswith("type=bind") and a.endswith("target=/data,readonly") for a in args)


def test_the_bare_node_recipe_is_found_on_its_docs_page():
    recipe, source = extract_recipe()
    assert source == ROOT / "docs" / "deploy-bare-nodes.md"
    assert recipe.count("docker run") == 3 and "--max-steps" in recipe


def test_expected_checkpoints():
    assert expected_checkpoints(12, 3, 4) == [3, 4, 6, 8, 9, 12]
    assert expected_checkpoints(4, 2, 2) == [2, 4]


def test_checks_on_a_written_run(tmp_path):
    torch = pytest.importorskip("torch")
    from maskrcnn_dist.checkpoint import publish_best, save_checkpoint

    run = tmp_path / "run"
    run.mkdir()
    lines = [{"kind": "train", "step": s, "loss": 1.0, "lr": 0.1} for s in (1, 2)]
    lines += [{"kind": "val", "step": 2, "loss": 1.0}, {"kind": "eval", "step": 2, "bbox_AP": 0.0, "segm_AP": 0.0}]
    import json

    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"torn')
    checks.check_training_complete(run, 2)
    with pytest.raises(checks.Failed, match="plan is 1..3"):
        checks.check_training_complete(run, 3)
    save_checkpoint({"model": {"w": torch.zeros(1)}, "step": 2}, run / "checkpoints", 2, keep=3)
    assert checks.check_checkpoints(run, expected_steps=[2]) == [2]
    (run / "checkpoints" / ".checkpoint_00000004.pt.tmp-7").write_bytes(b"half")
    with pytest.raises(checks.Failed, match="partial checkpoint"):
        checks.check_checkpoints(run)
    assert checks.check_checkpoints(run, just_crashed=True) == [2]  # a killed writer's file, until the next save
    save_checkpoint({"model": {"w": torch.zeros(1)}, "step": 3}, run / "checkpoints", 3, keep=3)
    assert checks.check_checkpoints(run) == [2, 3]  # the next save removed the dead writer's file
    publish_best(run / "checkpoints" / "checkpoint_00000003.pt")
    assert checks.check_checkpoints(run) == [2, 3]  # best.pt is a checkpoint's, not a stray
    (run / "checkpoints" / ".best.pt.tmp-7").write_bytes(b"half")
    with pytest.raises(checks.Failed, match="partial checkpoint"):
        checks.check_checkpoints(run)
    assert checks.check_checkpoints(run, just_crashed=True) == [2, 3]
    (run / "checkpoints" / ".best.pt.tmp-7").unlink()
    (run / "checkpoints" / "checkpoint_00000009.pt").write_bytes(b"torn")
    with pytest.raises(Exception, match="not a PyTorch file|cannot be read"):
        checks.check_checkpoints(run)


# -- JobSet ---------------------------------------------------------------------------------------


def _container(controller, rjob: str, index: int = 0) -> str:
    return controller.pods(rjob)[index].container


def test_jobset_pods_from_the_chart(jobset_run, tmp_path):
    controller, cluster = jobset_run()
    spec = controller.spec
    assert spec.subdomain == "e2e-maskrcnn-dist-headless"
    assert (spec.max_restarts, spec.restart_strategy) == (3, "BlockingRecreate")
    assert [p.spec.host for j in controller.attempt.jobs for p in j.pods] == [
        "e2e-maskrcnn-dist-master-0-0",
        "e2e-maskrcnn-dist-workers-0-0",
        "e2e-maskrcnn-dist-workers-0-1",
    ]
    worker = controller.pods("workers")[1].spec
    assert worker.name.startswith("e2e-maskrcnn-dist-workers-0-1-") and len(worker.name) == len(worker.host) + 6
    assert worker.fqdn == "e2e-maskrcnn-dist-workers-0-1.e2e-maskrcnn-dist-headless.e2e.svc.cluster.local"
    # The downward API resolves the controllers' labels and annotations; the Job adds its variable.
    assert {k: worker.env[k] for k in ("MASKRCNN_JOBSET_NAME", "MASKRCNN_REPLICATED_JOB", "MASKRCNN_JOB_INDEX")} == {
        "MASKRCNN_JOBSET_NAME": "e2e-maskrcnn-dist",
        "MASKRCNN_REPLICATED_JOB": "workers",
        "MASKRCNN_JOB_INDEX": "0",
    }
    assert worker.env["MASKRCNN_COMPLETION_INDEX"] == worker.env["JOB_COMPLETION_INDEX"] == "1"
    assert worker.env["POD_NAME"] == worker.name and worker.component == "worker" and worker.ordinal == 1
    assert worker.labels["jobset.sigs.k8s.io/restart-attempt"] == "0"
    args = " ".join(docker_run_args(worker, "c", "net", "img:1", tmp_path, {}))
    assert f"--hostname {worker.host} " in args and f"--network-alias {worker.fqdn} " in args
    assert set(cluster.running()) == set(cluster.containers), "every pod starts at once"


def test_jobset_completes_when_the_master_completes(jobset_run):
    controller, cluster = jobset_run()
    cluster.exit(_container(controller, "workers", 0), 0)
    assert controller.reconcile() is None, "a worker finishing is not the JobSet's success"
    cluster.exit(_container(controller, "master"), 0, second=2)
    assert controller.reconcile() == "Completed"
    assert controller.condition.reason == "AllJobsCompleted" and controller.restarts == 0
    assert cluster.stopped == [_container(controller, "workers", 1)], "the workers' job is deleted"
    assert not cluster.running()
    created = len(cluster.containers)
    assert controller.reconcile() == "Completed" and len(cluster.containers) == created, "nothing restarts"


def test_jobset_fails_at_once_on_a_user_error(jobset_run):
    controller, cluster = jobset_run()
    cluster.exit(_container(controller, "workers", 1), 2)
    assert controller.reconcile() == "Failed"
    assert controller.condition.reason == "FailJobSetFailurePolicyAction"
    assert "(first failed job: e2e-maskrcnn-dist-workers-0)" in controller.condition.message
    assert controller.restarts == 0 and len(controller.attempts) == 1 and not cluster.running()
    (job,) = [j for j in controller.attempt.jobs if j.condition == "Failed"]
    assert job.reason == "PodFailurePolicy" and "exit code 2 matching FailJob rule at index 0" in job.message


def test_jobset_restarts_the_whole_group_until_max_restarts(jobset_run):
    controller, cluster = jobset_run({"jobset": {"failurePolicy": {"maxRestarts": 2}}})
    hosts = [p.host for p in controller.pod_specs()]
    for attempt in (1, 2):
        old, victim = list(cluster.running()), _container(controller, "workers", 1)
        cluster.exit(victim, 137)  # a lost pod: not a user error
        assert controller.reconcile() is None
        assert controller.restarts == attempt and controller.attempt.number == attempt
        assert sorted(cluster.stopped[-2:]) == sorted(n for n in old if n != victim)
        assert not set(cluster.running()) & set(old), "BlockingRecreate: every old pod stopped first"
        assert [p.host for p in controller.pod_specs()] == hosts, "same host names"
        assert {p.labels["jobset.sigs.k8s.io/restart-attempt"] for p in controller.pod_specs()} == {str(attempt)}
        assert len(set(cluster.running())) == 3
    cluster.exit(_container(controller, "master"), 1)
    assert controller.reconcile() == "Failed"
    assert controller.condition.reason == "ReachedMaxRestarts" and controller.restarts == 2
    assert not cluster.running()


def test_jobset_features_the_harness_does_not_emulate_are_refused(jobset_render):
    obj = next(o for o in jobset_render() if o["kind"] == "JobSet")
    parse_jobset(obj, "e2e")
    for key, value in (
        ("coordinator", {"replicatedJob": "master"}),
        ("startupPolicy", {"startupPolicyOrder": "InOrder"}),
    ):
        with pytest.raises(SpecError):
            parse_jobset({**obj, "spec": {**obj["spec"], key: value}}, "e2e")
    rule = {"name": "x", "action": "RestartJob"}
    policy = {**obj["spec"]["failurePolicy"], "rules": [rule]}
    with pytest.raises(SpecError, match="RestartJob"):
        parse_jobset({**obj, "spec": {**obj["spec"], "failurePolicy": policy}}, "e2e")
