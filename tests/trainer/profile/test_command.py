"""`maskrcnn-dist profile` end to end at the smallest size: the table, the choice, the limits, and a
--write-topology file that the launcher accepts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
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


@pytest.mark.slow
def test_profile_prints_a_ranked_table_and_writes_a_topology_the_launcher_accepts(tmp_path: Path) -> None:
    topology = small_topology(tmp_path / "small.yaml")
    written = tmp_path / "new" / "recommended.yaml"  # a missing folder is made, as for --output-dir
    args = ["profile", *TINY, "--topology", str(topology), "--batch-size", "2", "--micro-batches", "2"]
    args += ["--threads", "1", "--iterations", "1", "--write-topology", str(written)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("#  engine"))
    for column in ("split", "replicas", "img/step", "step s", "images/s", "mem/device", "fits"):
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


@pytest.mark.slow
def test_with_a_data_path_the_report_and_topology_hold_the_datas_image_size_and_instances(
    tmp_path: Path, tiny_coco: Path
) -> None:
    """Not the topology's estimate (800x1333, 7 instances): what the measured images are and hold."""
    import json
    import math

    written = tmp_path / "recommended.yaml"
    args = ["profile", *TINY, "--topology", "three-machines", "--batch-size", "2", "--micro-batches", "1"]
    args += ["--threads", "1", "--iterations", "2", "--data-path", str(tiny_coco), "--write-topology", str(written)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    coco = json.loads((tiny_coco / "train" / "annotations.json").read_text())
    first = coco["images"][:4]  # 2 micro-batches of 2, in file order
    size = (max(i["height"] for i in first), max(i["width"] for i in first))
    ids = {i["id"] for i in first}
    instances = math.ceil(sum(a["image_id"] in ids for a in coco["annotations"]) / len(first))
    assert f"of {size[0]}x{size[1]} px" in result.output.splitlines()[0]
    estimate = load_topology(str(written)).estimate
    assert (estimate.image_size, estimate.instances_per_image) == (size, instances)
    assert size != (800, 1333)


NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is there: --device cuda/auto is valid")
# (case id, profile flags after TINY with {tmp}/{file}/{binary}/{bad} placeholders, fragments of the line)
WRONG_INPUTS = [
    ("link-zero", ["--link-gbps", "0"], ["--link-gbps must be >= 0.001"]),
    ("link-negative", ["--link-gbps", "-1"], ["--link-gbps must be >= 0.001"]),
    ("link-nan", ["--link-gbps", "nan"], ["--link-gbps must be a finite number"]),
    ("link-inf", ["--link-gbps", "inf"], ["--link-gbps must be a finite number"]),
    ("topology-missing", ["--topology", "{tmp}/none.yaml"], ["none.yaml", "neither a file"]),
    ("topology-binary", ["--topology", "{binary}"], ["binary.yaml", "not a text"]),
    ("topology-invalid", ["--topology", "{bad}"], ["bad.yaml", "engine"]),
    ("batch-zero", ["--batch-size", "0"], ["--batch-size must be >= 1"]),
    (
        "micro-batches-above-batch",
        ["--batch-size", "2", "--micro-batches", "3"],
        ["--micro-batches 3 > --batch-size 2"],
    ),
    ("image-size-zero", ["--min-size", "0"], ["--min-size must be >= 32"]),
    ("image-size-huge", ["--max-size", "100000"], ["--max-size must be <= 8192"]),
    ("iterations-zero", ["--iterations", "0"], ["--iterations must be >= 1"]),
    ("memory-zero", ["--device-memory-gib", "0"], ["--device-memory-gib must be >= 0.001"]),
    ("write-topology-folder", ["--write-topology", "{tmp}"], ["--write-topology", "a folder; give a file name"]),
    ("write-topology-not-yaml", ["--write-topology", "{tmp}/t.json"], ["--write-topology", "must end in .yaml"]),
    ("write-topology-under-a-file", ["--write-topology", "{file}/t.yaml"], ["--write-topology", "a-file"]),
    ("write-values-under-a-file", ["--write-values", "{file}/v.yaml"], ["--write-values", "a-file"]),
    (
        "write-values-uneven-workers",  # the chart's worker.gpus is one value; this topology has 1 and 2
        ["--topology", "three-machines-gpu", "--device", "cpu", "--write-values", "{tmp}/v.yaml"],
        ["--write-values", "different device counts"],
    ),
    ("data-path-missing", ["--data-path", "{tmp}/none"], ["--data-path", "no such folder"]),
    pytest.param("cuda-without-gpu", ["--device", "cuda"], ["--device cuda"], marks=NO_GPU),
    pytest.param(
        "fp16-on-auto-cpu", ["--device", "auto", "--amp", "--amp-dtype", "float16"], ["float16"], marks=NO_GPU
    ),
]


def _wrong_input_args(tmp: Path, args: list[str]) -> list[str]:
    files = {"file": tmp / "a-file", "binary": tmp / "binary.yaml", "bad": tmp / "bad.yaml"}
    files["file"].write_text("not a folder\n")
    files["binary"].write_bytes(bytes(range(256)))
    files["bad"].write_text("engine: nonsense\n")
    values = {"tmp": str(tmp), **{k: str(v) for k, v in files.items()}}
    topology = ["--topology", str(small_topology(tmp / "small.yaml"))]
    given = [a.format(**values) for a in args]
    # A flag under test replaces TINY's or the topology (an option given twice is refused).
    named = {word for word in given if word.startswith("--")}
    base = [*TINY, *topology]
    kept = [w for i in range(0, len(base), 2) for w in base[i : i + 2] if base[i] not in named]
    return ["profile", *kept, *given]


@pytest.mark.parametrize(("case", "args", "fragments"), WRONG_INPUTS)
def test_wrong_inputs_are_refused_in_one_line_before_measuring(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, case: str, args: list[str], fragments: list[str]
) -> None:
    """Exit 2 with one `error:` line naming the flag or file, and before minutes of measuring."""

    def measured(*_: object, **__: object) -> None:
        raise AssertionError("measured before refusing the input")

    monkeypatch.setattr("maskrcnn_dist.profile.command.measure", measured)
    result = CliRunner().invoke(main, _wrong_input_args(tmp_path, args))
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert all(fragment in lines[0] for fragment in fragments), lines[0]
    assert (tmp_path / "a-file").read_text() == "not a folder\n" and not (tmp_path / "v.yaml").exists()


@pytest.mark.parametrize("case", ["link-nan", "topology-binary", "write-topology-folder", "micro-batches-above-batch"])
def test_wrong_inputs_through_the_console_script(console, tmp_path: Path, case: str) -> None:
    """The same refusals from the installed `maskrcnn-dist`, in a subprocess: stderr, no traceback."""
    _, args, fragments = next(c for c in WRONG_INPUTS if c[0] == case)
    result = console("maskrcnn-dist", *_wrong_input_args(tmp_path, args))
    result.assert_one_error_line(2, *(f.format(tmp=tmp_path) for f in fragments))
    assert "Traceback" not in result.stderr and not result.stdout


@pytest.mark.slow
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


def runnable_chart_cases() -> list[tuple[object, object]]:
    """(base topology, candidate) for every candidate the profiler offers on a CPU and a GPU topology
    the chart can describe (every worker with the same devices), GPU replicas included."""
    from maskrcnn_launcher.topology import parse_topology

    from maskrcnn_dist.profile.candidates import candidates
    from maskrcnn_dist.profile.write import launchable

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
    assert {c.engine for _, c in runnable} == {"ddp", "pipeline"}
    return runnable


def test_chart_values_validate_against_the_charts_schema() -> None:
    """--write-values of every candidate, over the chart's defaults (as `helm -f` merges them), is
    valid under helm/values.schema.json: no helm needed."""
    import json

    import jsonschema

    from maskrcnn_dist.profile.write import chart_values, topology_document

    root = Path(__file__).resolve().parents[3]
    schema = json.loads((root / "helm" / "values.schema.json").read_text())
    defaults = yaml.safe_load((root / "helm" / "values.yaml").read_text())

    def merged(base: dict, over: dict) -> dict:
        return {
            **base,
            **{
                k: merged(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
                for k, v in over.items()
            },
        }

    for base, cand in runnable_chart_cases():
        values = chart_values(topology_document(cand, base, 4, 2, (128, 128), 3, "float32"))
        errors = [e.message for e in jsonschema.Draft7Validator(schema).iter_errors(merged(defaults, values))]
        assert not errors, (cand, errors)


def test_chart_values_render_the_candidates_topology(tmp_path: Path, helm: str) -> None:
    """--write-values: `helm template -f` renders a topology ConfigMap the launcher reads back as the
    same engine, stages and replicas. The batch and micro-batch count are stated once, in trainer.args
    (the values file names them in its header): the rendered estimate follows those flags."""
    import subprocess

    from maskrcnn_launcher.topology import parse_topology

    from maskrcnn_dist.profile.write import topology_document, write_values

    root = Path(__file__).resolve().parents[3]
    for base, cand in runnable_chart_cases():
        values = tmp_path / "values.yaml"
        write_values(values, topology_document(cand, base, 4, 2, (128, 128), 3, "float32"))
        text = values.read_text()
        assert "# Measured at --batch-size 4 --micro-batches 2:" in text
        written = yaml.safe_load(text)
        assert "batch_size" not in written["estimate"] and "micro_batches" not in written["estimate"]
        args = ["--set-json", 'trainer.args=["--batch-size","4","--micro-batches","2"]']
        proc = subprocess.run(
            [helm, "template", "t", str(root / "helm"), "-f", str(values), *args], capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stderr
        maps = [d for d in yaml.safe_load_all(proc.stdout) if d and d.get("kind") == "ConfigMap"]
        texts = [text for d in maps for key, text in (d.get("data") or {}).items() if key.endswith(".yaml")]
        rendered = parse_topology(yaml.safe_load(texts[0]))
        assert (rendered.estimate.batch_size, rendered.estimate.micro_batches) == (4, 2)
        assert rendered.engine == cand.engine
        if cand.engine == "pipeline":
            assert tuple(s.modules for s in rendered.stages) == cand.stages
            assert tuple(w.replicas for w in rendered.workers) == cand.replicas
        else:
            assert len(rendered.workers) == len(base.workers)
