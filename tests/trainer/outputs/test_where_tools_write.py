"""eval, predict, export and report write only where they are told: nothing in the folder they run in,
nothing in the run whose checkpoint they read, and nothing that makes a later run refuse its folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from maskrcnn_dist.run_dir import METRICS_FILE

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under `folder` with its size and modification time."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


def test_the_tools_write_only_where_they_are_told(console, trained: Path, sparse_coco: Path, tmp_path: Path):
    run = trained.parent.parent
    before = snapshot(run)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    out = tmp_path / "out"
    image = next((sparse_coco / "val" / "images").iterdir())

    evaluated = console("maskrcnn-dist", "eval", "--resume", str(trained.parent), cwd=cwd)
    assert evaluated.code == 0, evaluated.stderr[-3000:]
    assert "bbox_AP" in json.loads(evaluated.stdout.splitlines()[-1])
    predicted = console(
        "maskrcnn-dist", "predict", "--resume", str(trained), "--out", str(out / "predict"), str(image), cwd=cwd
    )
    assert predicted.code == 0, predicted.stderr[-3000:]
    exported = console(
        "maskrcnn-dist", "export", "--resume", str(trained), "--format", "torchscript", "--out",
        str(out / "model.pt"), "--parity-images", "1", cwd=cwd,
    )  # fmt: skip
    assert exported.code == 0, exported.stderr[-3000:]
    reported = console("maskrcnn-dist", "report", "--metrics", str(run), "--out", str(out / "curves.png"), cwd=cwd)
    assert reported.code == 0, reported.stderr[-3000:]

    assert list(cwd.iterdir()) == []  # no ./runs/train for a later run to find taken
    assert snapshot(run) == before
    assert sorted(p.name for p in out.iterdir()) == ["curves.png", "model.pt", "predict"]


def test_eval_told_an_output_dir_records_its_ap_there(console, trained: Path, tmp_path: Path):
    record = tmp_path / "record"
    result = console("maskrcnn-dist", "eval", "--resume", str(trained), "--output-dir", str(record))
    assert result.code == 0, result.stderr[-3000:]
    (line,) = (record / METRICS_FILE).read_text().splitlines()
    assert json.loads(line)["kind"] == "eval"
