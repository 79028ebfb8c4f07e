"""`maskrcnn-dist profile` end to end at the smallest size: the table, the choice, the limits, and a
--write-topology file that the launcher accepts."""

from __future__ import annotations

from pathlib import Path

import yaml
from click.testing import CliRunner
from maskrcnn_launcher.cli import main as launcher_main
from maskrcnn_launcher.topology import load_topology

from maskrcnn_dist.cli import main

TINY = ["--model", "maskrcnn_resnet18_fpn", "--min-size", "128", "--max-size", "128", "--device", "cpu"]


def small_topology(path: Path) -> Path:
    """The packaged three-machines topology at 128 px."""
    doc = yaml.safe_load(load_topology_text("three-machines"))
    doc["estimate"]["image_size"] = [128, 128]
    doc["estimate"]["instances_per_image"] = 2
    path.write_text(yaml.safe_dump(doc))
    return path


def load_topology_text(name: str) -> str:
    from maskrcnn_launcher.topology import read_topology_text

    return read_topology_text(name)[1]


def test_profile_prints_a_ranked_table_and_writes_a_topology_the_launcher_accepts(tmp_path: Path) -> None:
    topology = small_topology(tmp_path / "small.yaml")
    written = tmp_path / "recommended.yaml"
    args = ["profile", *TINY, "--topology", str(topology), "--batch-size", "2", "--micro-batches", "2"]
    args += ["--threads", "1", "--iterations", "1", "--write-topology", str(written)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("#  engine"))
    for column in ("split", "replicas", "step s", "images/s", "mem/device", "fits"):
        assert column in lines[header]
    rows = [line for line in lines[header + 1 :] if line[:1].isdigit()]
    # ddp, then 1-stage and 2 runnable 2-stage splits (transform alone is not a stage)
    assert len(rows) == 4
    assert sum(" ddp " in row for row in rows) == 1
    speeds = [float(row.split()[-5]) for row in rows]
    assert speeds == sorted(speeds, reverse=True)  # all fit in host RAM: ranked by images/s alone
    choice = next(line for line in lines if line.startswith("choose "))
    assert " because it predicts " in choice
    assert any("network is modelled, not measured" in line for line in lines)
    assert any("instances per image" in line for line in lines)
    assert f"topology written: {written}" in result.output

    chosen = load_topology(str(written))  # the launcher's own parser
    assert chosen.engine == rows[0].split()[1]
    assert chosen.estimate.image_size == (128, 128)
    plan = CliRunner().invoke(launcher_main, ["plan", "--topology", str(written)])
    assert plan.exit_code == 0, plan.output


def test_profile_names_a_bad_topology_in_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["profile", *TINY, "--topology", str(tmp_path / "missing.yaml")])
    assert result.exit_code == 2
    assert "missing.yaml" in result.output and "Traceback" not in result.output


def test_profile_writes_nothing_when_no_candidate_fits(tmp_path: Path) -> None:
    topology = small_topology(tmp_path / "small.yaml")
    written = tmp_path / "recommended.yaml"
    args = ["profile", *TINY, "--topology", str(topology), "--batch-size", "2", "--threads", "1"]
    args += ["--iterations", "1", "--device-memory-gib", "0.01", "--write-topology", str(written)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    assert "no candidate fits" in result.output and not written.exists()


def test_every_candidate_writes_a_topology_the_launcher_accepts(tmp_path: Path) -> None:
    from maskrcnn_dist.profile.candidates import candidates
    from maskrcnn_dist.profile.write import launchable, topology_document, write_topology

    base = load_topology("three-machines-gpu")
    runnable = [cand for cand in candidates(base) if launchable(cand, base)]
    # No ddp (a CPU master beside GPU workers); device maps refuse fewer replicas after more.
    assert {c.engine for c in runnable} == {"pipeline"}
    assert all(c.replicas != (2, 1) for c in runnable) and any(c.replicas == (1, 2) for c in runnable)
    for i, cand in enumerate(runnable):
        path = tmp_path / f"{i}.yaml"
        write_topology(path, topology_document(cand, base, 4, 2, (128, 128), 3, "float32"))
        loaded = load_topology(str(path))  # the launcher's own parser, as `plan --topology` reads it
        assert loaded.engine == cand.engine
        if cand.engine == "pipeline":
            assert tuple(s.modules for s in loaded.stages) == cand.stages
            assert tuple(w.replicas for w in loaded.workers) == cand.replicas


def test_chart_values_render_the_candidates_topology(tmp_path: Path) -> None:
    """--write-values: `helm template -f` renders a topology ConfigMap the launcher reads back as the
    same engine, stages and replicas."""
    import shutil
    import subprocess

    import pytest
    from maskrcnn_launcher.topology import parse_topology

    from maskrcnn_dist.profile.candidates import candidates
    from maskrcnn_dist.profile.write import launchable, topology_document, write_values

    root = Path(__file__).resolve().parents[3]
    helm = shutil.which("helm") or next((str(p) for p in [root / ".tools" / "helm"] if p.is_file()), None)
    if helm is None:
        pytest.skip("no helm on PATH (helm/hack/get-helm.sh installs one into .tools)")
    cpu = load_topology("three-machines")
    gpus = parse_topology(
        {
            "engine": "pipeline",
            "workers": [{"devices": 2, "stage": "a"}, {"devices": 2, "stage": "b"}],
            "stages": [
                {"name": "a", "modules": ["transform", "backbone"]},
                {"name": "b", "modules": ["rpn", "roi_heads"]},
            ],
        }
    )
    runnable = [(base, c) for base in (cpu, gpus) for c in candidates(base) if launchable(c, base)]
    assert any(max(c.replicas, default=1) > 1 for _, c in runnable)
    for base, cand in runnable:
        values = tmp_path / "values.yaml"
        write_values(values, topology_document(cand, base, 4, 2, (128, 128), 3, "float32"))
        proc = subprocess.run(
            [helm, "template", "t", str(root / "helm"), "-f", str(values)], capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stderr
        maps = [d for d in yaml.safe_load_all(proc.stdout) if d and d.get("kind") == "ConfigMap"]
        texts = [text for d in maps for key, text in (d.get("data") or {}).items() if key.endswith(".yaml")]
        rendered = parse_topology(yaml.safe_load(texts[0]))
        assert rendered.engine == cand.engine
        if cand.engine == "pipeline":
            assert tuple(s.modules for s in rendered.stages) == cand.stages
            assert tuple(w.replicas for w in rendered.workers) == cand.replicas
        else:
            assert len(rendered.workers) == len(base.workers)
