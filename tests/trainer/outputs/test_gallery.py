"""report --gallery: predictions beside ground truth in a PNG a viewer opens, its heading clear of the
first row, and a request that cannot be drawn refused before the report is written."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from maskrcnn_dist.config import GALLERY_MAX
from maskrcnn_dist.errors import ConfigError
from maskrcnn_dist.outputs.gallery import (
    HEADING_INCHES,
    TITLE_INCHES,
    check_gallery_request,
    draw_gallery,
    figure_inches,
    gallery_figure,
)
from maskrcnn_dist.outputs.report import pyplot

from .conftest import the_error_line


def test_gallery_draws_predictions_beside_truth(trained: Path, tmp_path: Path):
    png = draw_gallery(trained, 2, tmp_path / "report_gallery.png")  # the dataset the checkpoint names
    from PIL import Image

    with Image.open(png) as im:
        assert im.width > im.height / 2 > 100  # two columns, two rows


@pytest.mark.parametrize(
    ("rows", "height", "width"),
    [(1, 96, 128), (GALLERY_MAX, 256, 256), (GALLERY_MAX, 480, 640), (GALLERY_MAX, 4096, 3072), (3, 30000, 200)],
)
def test_a_gallery_is_a_png_a_viewer_opens(rows: int, height: int, width: int):
    from PIL import Image

    inches_wide, inches_high = figure_inches(rows, height, width)
    assert inches_high * 100 < 2**16 and inches_wide * inches_high * 100**2 < Image.MAX_IMAGE_PIXELS
    if height <= 480:  # small and COCO-sized images keep their own pixels
        assert inches_high == pytest.approx(rows * (height / 100 + TITLE_INCHES) + HEADING_INCHES)


@pytest.mark.parametrize(
    ("resume", "count", "message"),
    [
        (None, 4, "needs --resume CHECKPOINT"),
        (Path("run/checkpoints"), 0, f"must be 1 to {GALLERY_MAX} images, got 0"),
        (Path("run/checkpoints"), GALLERY_MAX + 1, f"got {GALLERY_MAX + 1}"),
    ],
)
def test_a_gallery_request_is_checked_first(resume: Path | None, count: int, message: str):
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_gallery_request(resume, count)
    check_gallery_request(Path("run/checkpoints"), GALLERY_MAX)


@pytest.mark.parametrize("rows", [1, 2, 6, 20])
def test_the_gallery_heading_clears_the_first_row(rows: int):
    image = torch.full((3, 256, 256), 120, dtype=torch.uint8)
    fig = gallery_figure([(i, image, image) for i in range(rows)], "checkpoint run/checkpoints: a heading", 0.5)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    heading = fig._suptitle.get_window_extent(renderer)
    first_titles = [ax.title.get_window_extent(renderer) for ax in fig.axes[:2]]
    assert all(heading.y0 >= title.y1 for title in first_titles)  # display y grows upwards
    pyplot().close(fig)


@pytest.mark.slow
def test_report_refuses_a_gallery_without_a_model_before_writing(tmp_path: Path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps({"kind": "train", "step": 1, "loss": 1.0}) + "\n")
    argv = [sys.executable, "-m", "maskrcnn_dist.cli", "report", "--metrics", metrics, "--gallery", "2"]
    result = subprocess.run(list(map(str, argv)), capture_output=True, text=True, timeout=120)
    assert "needs --resume" in the_error_line(result)
    assert not (tmp_path / "report.png").exists()
