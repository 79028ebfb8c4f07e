"""The report's gallery: a few validation images, the model's predictions beside their ground truth.

A second PNG next to the curves (report_gallery.png for report.png) rather than a panel inside them:
the curves are a fixed-size chart, the gallery is as tall as the number of images asked for, and each
image keeps its own pixels (enlarged by whole factors) instead of being resampled into a chart's cell.
The images are checked and read as predict reads a split (in the frame the data check decides), and
drawn in their display frame.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Subset

from ..config import GALLERY_MAX
from ..data import build_eval_loader, open_split
from ..data.images.check import CheckRules
from ..data.images.orientation import to_display
from ..errors import ConfigError
from .draw import draw_detections, to_uint8
from .inputs import NOTHING_PREDICTED, dataset_frames, dataset_images
from .predict import draw_prediction, legible_scale
from .predictor import data_config, load_predictor
from .report import pyplot, save_figure

GALLERY_BATCH = 1  # one image per forward pass, as predict: each drawn as it is detected alone, not padded
# Each row at most this tall (inches at 100 dpi; larger images are shown smaller), so that the PNG stays
# one a viewer opens (PIL refuses images over 89 Mpixel as decompression bombs).
ROW_INCHES = 5.0
TITLE_INCHES = 0.45  # a row's title above its images
HEADING_INCHES = 0.4  # the gallery's own title, kept clear of the first row's (tight_layout ignores it)
# One row: the image id, the drawing of the predictions, the drawing of the ground truth (uint8 [3, H, W]).
Row = tuple[int, torch.Tensor, torch.Tensor]


def figure_inches(rows: int, height_px: int, width_px: int) -> tuple[float, float]:
    """(width, height) of a gallery of `rows` rows of two images of at most `height_px` x `width_px`."""
    scale = min(1.0, ROW_INCHES * 100 / max(1, height_px))
    height, width = height_px * scale / 100, width_px * scale / 100
    return 2 * width + 0.4, rows * (height + TITLE_INCHES) + HEADING_INCHES


def gallery_path(report_png: Path) -> Path:
    """report.png -> report_gallery.png, beside it."""
    report_png = Path(report_png)
    return report_png.with_name(f"{report_png.stem}_gallery.png")


def check_gallery_request(resume: Path | None, count: int) -> None:
    """What `report` checks before drawing anything: a gallery needs a model and a count in range."""
    if resume is None:
        raise ConfigError("report --gallery N needs --resume CHECKPOINT (the model whose predictions to draw)")
    if not 1 <= count <= GALLERY_MAX:
        raise ConfigError(f"report --gallery must be 1 to {GALLERY_MAX} images, got {count}")


def draw_gallery(
    resume: Path | None,
    count: int,
    out_png: Path,
    data_path: Path | None = None,
    split: str = "val",
    score_threshold: float = 0.5,
    device: str = "cpu",
) -> Path:
    """The first `count` images of `split` (under `data_path`, default: the dataset the checkpoint was
    trained on): predictions of checkpoint `resume` (left) and ground truth (right), one row each."""
    check_gallery_request(resume, count)
    predictor = load_predictor({"resume": resume, "device": device})
    # Checked and read as training read them: the checkpoint's orientation rule, its model's sizes.
    rules = CheckRules.of(predictor.engine.cfg, mode="header")
    flags = {"data-path": data_path} if data_path is not None else {}
    split_cfg = data_config(flags, predictor, rules.exif_orientation, default_to_checkpoint=True)
    if split_cfg is None:
        raise ConfigError(f"report --gallery: {predictor.source} records no dataset; give --data-path")
    dataset = open_split(split_cfg, split, rules, first=count, hint=NOTHING_PREDICTED)
    categories = predictor.categories_for(dataset)
    shown = dataset_images(dataset)[:count]
    frames = dataset_frames(dataset, shown)
    rows: list[Row] = []
    subset = Subset(dataset, range(len(shown)))
    for images, targets in build_eval_loader(subset, GALLERY_BATCH):
        for image, target, detection in zip(images, targets, predictor.predict(images)):
            frame = frames[int(target["image_id"])]
            truth = draw_detections(
                to_uint8(image),
                target["boxes"],
                target["masks"],
                [categories.caption(int(label)) for label in target["labels"]],
                "no objects",
                legible_scale(image),
            )
            predicted = draw_prediction(image, detection, categories, score_threshold)
            rows.append((int(target["image_id"]), to_display(predicted, frame), to_display(truth, frame)))
    if not rows:
        raise ConfigError(f"report --gallery: the {split} split ({dataset.source.describe()}) holds no images")

    after = f" after {predictor.step} steps" if predictor.step is not None else ""
    heading = f"{predictor.source}{after}: the first {len(rows)} {split} images"
    return save_figure(gallery_figure(rows, heading, score_threshold), out_png)


def gallery_figure(rows: list[Row], heading: str, score_threshold: float) -> Any:
    """The matplotlib figure of `rows`: predictions left, ground truth right, `heading` on top."""
    size = figure_inches(len(rows), max(p.shape[-2] for _, p, _ in rows), max(p.shape[-1] for _, p, _ in rows))
    fig, axes = pyplot().subplots(len(rows), 2, figsize=size, squeeze=False)
    for (image_id, predicted, truth), (ax_pred, ax_truth) in zip(rows, axes):
        ax_pred.imshow(predicted.permute(1, 2, 0).numpy(), interpolation="nearest")
        ax_pred.set_title(f"image {image_id}: predicted (score >= {score_threshold:g})", fontsize=9)
        ax_truth.imshow(truth.permute(1, 2, 0).numpy(), interpolation="nearest")
        ax_truth.set_title(f"image {image_id}: ground truth", fontsize=9)
        for ax in (ax_pred, ax_truth):
            ax.axis("off")
    # The heading in a band of HEADING_INCHES at the top, the rows below it, whatever the figure's
    # height (matplotlib places a heading and the rows in fractions of the height: tall galleries overlapped).
    fig.suptitle(heading, fontsize=10, y=1 - 0.1 / size[1], va="top")
    fig.tight_layout(rect=(0, 0, 1, 1 - HEADING_INCHES / size[1]))
    return fig
