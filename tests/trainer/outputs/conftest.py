"""Shared by the outputs tests: a small model trained once for the package (on tiny_coco with COCO-like
sparse category ids), image files, and the one error line of a refused command."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from once import built_once

from maskrcnn_dist.checkpoint import latest_checkpoint
from maskrcnn_dist.train import train

from ..conftest import MODEL_HEADS, fast_config

# The tests compare detections and AP, so the model must find objects: a non-zero AP50 for boxes and
# masks (else a results file that lost its detections would score the same). From scratch on 12 images
# the step where it first does depends on the CPU's rounding: at 24 steps seed 1 did on both CPUs
# measured (an Intel AVX-512 one and an AMD AVX2 one), seeds 2 and 4 on the Intel one only (36 steps on
# the AMD one). So it trains in rounds, each evaluated at its end, until it does (at most MAX_STEPS).
FIRST_STEPS, MORE_STEPS, MAX_STEPS = 24, 12, 96
SEED = 1


@pytest.fixture(scope="package")
def sparse_coco(tiny_coco: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny_coco with sparse category ids, as COCO's own (1..90 with gaps): a results file or a drawing
    that used label indices as category ids would then name categories the dataset does not have.
    One for the session's workers (tests/once.py), as `trained` records its path."""

    def build(folder: Path) -> None:
        root = folder / "data"
        shutil.copytree(tiny_coco, root)
        split_files = sorted(root.glob("*/annotations.json"))
        assert len(split_files) == 2  # train and val
        for split_file in split_files:
            coco = json.loads(split_file.read_text())
            sparse = {c["id"]: 10 * c["id"] + 7 for c in coco["categories"]}
            for category in coco["categories"]:
                category["id"] = sparse[category["id"]]
            for annotation in coco["annotations"]:
                annotation["category_id"] = sparse[annotation["category_id"]]
            split_file.write_text(json.dumps(coco))

    return built_once(tmp_path_factory, "sparse_coco", build) / "data"


@pytest.fixture(scope="package")
def trained(sparse_coco: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint of the small model that finds objects in sparse_coco's val split: trained once for the
    session's workers (tests/once.py; the tests only read it), its checkpoints dropped at the session's end."""
    out = built_once(tmp_path_factory, "predict_run", lambda folder: train_until_it_finds_objects(sparse_coco, folder))
    checkpoint = latest_checkpoint(out / "checkpoints")
    assert checkpoint is not None
    return checkpoint


def train_until_it_finds_objects(data: Path, folder: Path) -> None:
    """Train the small model on `data` into `folder` until its evaluation at the end of a round finds
    objects (bbox and segm AP50 above zero). Each round resumes the last one, so the run is one run, as
    any resumed run is."""
    flags = {"epochs": 100, "lr-steps": "1000", "val-period": 0, "seed": SEED, **MODEL_HEADS}
    for steps in range(FIRST_STEPS, MAX_STEPS + 1, MORE_STEPS):
        resume = {"resume": "auto"} if steps > FIRST_STEPS else {}
        found = train(fast_config(data, folder, **flags, **resume, **{"max-steps": steps})).eval
        assert found is not None
        if found["bbox_AP50"] > 0 and found["segm_AP50"] > 0:
            return
    raise AssertionError(f"the small model finds no objects after {MAX_STEPS} steps: {found}")


def write_png(path: Path, size: tuple[int, int] = (40, 30)) -> Path:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, (90, 120, 150)).save(path)
    return path


LOG_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (DEBUG|INFO) ")


def the_error_line(result: subprocess.CompletedProcess) -> str:
    """The one line of stderr that is not an INFO log record; exit status 2."""
    lines = [line for line in result.stderr.splitlines() if not LOG_RECORD.match(line)]
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1, result.stderr
    return lines[0]
