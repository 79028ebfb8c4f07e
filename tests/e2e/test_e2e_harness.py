"""The e2e harness's translation of the chart into containers (no docker needed: `make test` runs it).

What the containers of `make e2e` get must be what Kubernetes would give the pods: these tests pin
the kubelet's `$(VAR)` expansion, the downward API, DNS names and the security context mapping,
against the chart as rendered by helm.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the top-level `e2e` package

from e2e import checks  # noqa: E402
from e2e.docker import docker_run_args, quantity_bytes  # noqa: E402
from e2e.kube import expand, render_release  # noqa: E402
from e2e.scenarios import CPU_VALUES, DDP_CPU_OVERLAY, DDP_VALUES, expected_checkpoints, extract_recipe  # noqa: E402


@pytest.fixture(scope="module")
def helm() -> str:
    found = shutil.which("helm") or (str(ROOT / ".tools" / "helm") if (ROOT / ".tools" / "helm").is_file() else None)
    if found:
        return found
    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.run(
        [str(ROOT / "helm" / "hack" / "get-helm.sh"), str(ROOT / ".tools")], env=env, capture_output=True, text=True
    )
    if proc.returncode != 0:
        pytest.fail(f"no helm on PATH and helm/hack/get-helm.sh failed:\n{proc.stdout}\n{proc.stderr}")
    return str(ROOT / ".tools" / "helm")


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


def test_the_readme_recipe_is_found():
    recipe, source = extract_recipe(ROOT / "README.md")
    assert recipe.count("docker run") == 3 and "--max-steps" in recipe


def test_expected_checkpoints():
    assert expected_checkpoints(12, 3, 4) == [3, 4, 6, 8, 9, 12]
    assert expected_checkpoints(4, 2, 2) == [2, 4]


def test_checks_on_a_written_run(tmp_path):
    torch = pytest.importorskip("torch")
    from maskrcnn_dist.checkpoint import save_checkpoint

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
    (run / "checkpoints" / "checkpoint_00000009.pt").write_bytes(b"torn")
    with pytest.raises(Exception, match="cannot be read"):
        checks.check_checkpoints(run)
