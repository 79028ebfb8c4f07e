"""Shared by the outputs tests: a small model trained once for the package (on tiny_coco with COCO-like
sparse category ids), image files, and the one error line of a refused command."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from maskrcnn_dist.checkpoint import latest_checkpoint
from maskrcnn_dist.train import train

from ..conftest import fast_config
from ..disk import drop_checkpoints

# Enough steps from scratch for a non-zero AP on tiny_coco (24 steps: bbox AP50 about 0.1), so that a
# results file that lost detections scores differently. So few steps on 12 images leave the AP at 0 for
# some seeds (the samplers' draws decide); this one reaches a non-zero AP50 for boxes and masks.
STEPS = 24
SEED = 1


@pytest.fixture(scope="package")
def sparse_coco(tiny_coco: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """tiny_coco with sparse category ids, as COCO's own (1..90 with gaps): a results file or a drawing
    that used label indices as category ids would then name categories the dataset does not have."""
    root = tmp_path_factory.mktemp("sparse_coco") / "data"
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
    return root


@pytest.fixture(scope="package")
def trained(sparse_coco: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A checkpoint of the small model after STEPS steps on sparse_coco."""
    out = tmp_path_factory.mktemp("predict_run")
    flags = {"max-steps": STEPS, "epochs": 100, "lr-steps": "1000", "val-period": 0, "seed": SEED}
    cfg = fast_config(sparse_coco, out, **flags)
    train(cfg)
    checkpoint = latest_checkpoint(out / "checkpoints")
    assert checkpoint is not None
    yield checkpoint
    drop_checkpoints(out)


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
