"""Predict: images (inputs.py) -> the model's detections (predictor.py) -> drawings and COCO results.

The results are evaluation.detections_to_coco's records: on a split, with eval's batches, detections.json
scores exactly `eval`'s AP. Each image is read in the frame its check decided (the annotation file's for a
split, the display frame for files given by themselves); the drawings are shown in the display frame.
"""

from __future__ import annotations

import json
import logging
import math
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import torch
from PIL import Image

from ..categories import Categories
from ..config import DATA_SOURCE_FLAGS, PredictConfig
from ..data import CocoInstanceDataset, build_eval_loader, open_split, read_image
from ..data.images.check import CheckRules
from ..data.images.orientation import Frame, to_display
from ..errors import ConfigError, UserError
from ..evaluation import detections_to_coco
from ..run_dir import REPLACED_PREFIX, move_aside, output_folder_problem, replaced_stamp
from .draw import draw_detections, to_uint8
from .inputs import NOTHING_PREDICTED, InputImage, check_readable, collect_images, dataset_frames, dataset_images
from .predictor import data_config, load_predictor

log = logging.getLogger(__name__)

RESULTS_FILE = "detections.json"  # COCO results: a list of {image_id, category_id, bbox, score, segmentation}
IMAGES_FILE = "images.json"  # COCO images + categories, so that COCO(IMAGES_FILE).loadRes(RESULTS_FILE) works
# Drawings of images smaller than this (short side, pixels) are enlarged, so that captions stay legible.
LEGIBLE_SIDE = 256


def drawing_file(out: Path, item: InputImage) -> Path:
    return out / f"{item.name}.png"


def earlier_outputs(out: Path, images: list[InputImage]) -> list[str]:
    """The files in `out` that this run would write over: an earlier run's results and the drawings its
    IMAGES_FILE lists, and any file named like one of this run's drawings. A drawing that would replace
    one of the input images themselves is refused outright (UserError)."""
    inputs = {item.path.resolve() for item in images}
    for item in images:
        if drawing_file(out, item).resolve() in inputs:
            raise UserError(
                f"--out {out}: the drawing of {item.path} would replace that image itself; choose another --out"
            )
    names = [name for name in (RESULTS_FILE, IMAGES_FILE) if (out / name).exists()]
    names += _listed_drawings(out / IMAGES_FILE)
    names += [drawing_file(out, item).name for item in images if drawing_file(out, item).exists()]
    # An input image is never moved away (an earlier drawing given as input is read, not replaced).
    return [name for name in dict.fromkeys(names) if (out / name).exists() and (out / name).resolve() not in inputs]


def _listed_drawings(images_file: Path) -> list[str]:
    """The drawings an earlier run's IMAGES_FILE names; none when it is unreadable or older."""
    try:
        listed = json.loads(images_file.read_text())["images"]
        return [Path(str(image["drawing"])).name for image in listed if "drawing" in image]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def refuse_earlier_outputs(out: Path, earlier: list[str], overwrite: bool) -> None:
    if earlier and not overwrite:
        drawings = sum(name.endswith(".png") for name in earlier)
        what = [name for name in earlier if not name.endswith(".png")] + (
            [f"{drawings} drawing(s)"] if drawings else []
        )
        raise UserError(
            f"--out {out} already holds predictions ({', '.join(what)}): add --overwrite to move them into "
            f"{REPLACED_PREFIX}<time>/ there, or choose another --out"
        )


def _batches(
    images: list[InputImage], dataset: CocoInstanceDataset | None, frames: dict[int, Frame], batch_size: int
) -> Iterator[tuple[list[InputImage], list[torch.Tensor]]]:
    if dataset is not None:
        # eval's loader: the model pads each batch to its largest image, so only the same batches give
        # bit-identical detections.
        loader = build_eval_loader(dataset, batch_size)
        for start, (tensors, _targets) in zip(range(0, len(images), batch_size), loader):
            yield images[start : start + batch_size], tensors
        return
    for start in range(0, len(images), batch_size):
        chunk = images[start : start + batch_size]
        yield chunk, [read_image(item.path, frames[item.image_id])[0] for item in chunk]


# ---------------------------------------------------------------------------------------------------
# outputs


def legible_scale(image: torch.Tensor) -> int:
    """The integer enlargement that brings the image's short side to at least LEGIBLE_SIDE pixels."""
    return max(1, math.ceil(LEGIBLE_SIDE / max(1, min(image.shape[-2:]))))


def draw_prediction(
    image: torch.Tensor, detection: dict[str, torch.Tensor], categories: Categories, threshold: float
) -> torch.Tensor:
    """The detections scoring at least `threshold` on `image` (float [3, H, W]), as a uint8 drawing."""
    keep = detection["scores"] >= threshold
    masks = detection["masks"][keep, 0] > 0.5 if "masks" in detection else None
    captions = [
        f"{categories.caption(int(label))} {score:.2f}"
        for label, score in zip(detection["labels"][keep], detection["scores"][keep].tolist())
    ]
    note = f"no detections above {threshold:g}"
    return draw_detections(to_uint8(image), detection["boxes"][keep], masks, captions, note, legible_scale(image))


def save_png(image: torch.Tensor, path: Path) -> None:
    Image.fromarray(np.ascontiguousarray(image.permute(1, 2, 0).numpy())).save(path)


def _check_output_dir(out: Path) -> Path:
    if problem := output_folder_problem(out, "--out"):
        raise UserError(problem)
    return Path(out)


@dataclass
class PredictSummary:
    images: int
    detections: int  # records in the results file
    drawn: int  # detections at or above the score threshold
    out: Path
    results: Path


def predict_images(
    inputs: Sequence[Path], options: PredictConfig, flags: dict[str, Any], stream: TextIO | None = None
) -> PredictSummary:
    """Predict the images in `inputs` (files, folders) or, with flags["data-path"], in `options.split`;
    write one drawing per image, RESULTS_FILE and IMAGES_FILE into `options.out`. `flags`: the train
    flags given (config.PREDICT_TRAIN_FLAGS). Progress goes to `stream` (stderr) when it is a terminal."""
    assert options.out is not None  # config.build_predict_config requires it
    out = _check_output_dir(options.out)  # made once inputs and model are known to be good
    names_split = any(flags.get(flag) is not None for flag in DATA_SOURCE_FLAGS)
    if bool(inputs) == names_split:
        raise ConfigError(
            "predict: give image files or folders, or --data-path (or the split flags) with --split: one of them"
        )
    files = collect_images(inputs, out) if not names_split else []
    # The model first: its --min-size/--max-size are part of what makes an image usable.
    predictor = load_predictor(flags)
    cfg = predictor.engine.cfg
    split_cfg = data_config(flags, predictor, cfg.data.exif_orientation, default_to_checkpoint=False)
    rules = CheckRules.of(cfg, mode="header")  # every image checked before anything is written
    dataset = open_split(split_cfg, options.split, rules, hint=NOTHING_PREDICTED) if split_cfg is not None else None
    images = dataset_images(dataset) if dataset is not None else files
    categories = predictor.categories_for(dataset)
    frames = dataset_frames(dataset, images) if dataset is not None else check_readable(images, rules)
    earlier = earlier_outputs(out, images)
    refuse_earlier_outputs(out, earlier, options.overwrite)
    out.mkdir(parents=True, exist_ok=True)
    if earlier:
        log.warning(
            "--overwrite: earlier predictions in %s moved to %s", out, move_aside(out, replaced_stamp(), earlier)
        )
    stream = stream or sys.stderr
    results: list[dict[str, Any]] = []
    sizes: dict[int, tuple[int, int]] = {}
    drawn = 0
    for batch, tensors in _batches(images, dataset, frames, options.batch_size):
        for item, image, detection in zip(batch, tensors, predictor.predict(tensors)):
            results += detections_to_coco(item.image_id, detection, list(categories.ids))
            drawing = draw_prediction(image, detection, categories, options.score_threshold)
            save_png(to_display(drawing, frames[item.image_id]), drawing_file(out, item))
            drawn += int((detection["scores"] >= options.score_threshold).sum())
            sizes[item.image_id] = (image.shape[-1], image.shape[-2])
        _progress(stream, len(sizes), len(images))
    if stream.isatty():
        stream.write("\n")
    # "drawing" (an extra key COCO tools ignore) tells a later run which files to move aside.
    coco_images = [
        {
            "id": i.image_id,
            "file_name": str(i.path),
            "width": sizes[i.image_id][0],
            "height": sizes[i.image_id][1],
            "drawing": drawing_file(out, i).name,
        }
        for i in images
    ]
    (out / IMAGES_FILE).write_text(
        json.dumps({"images": coco_images, "annotations": [], "categories": categories.coco_categories()})
    )
    (out / RESULTS_FILE).write_text(json.dumps(results))
    return PredictSummary(len(images), len(results), drawn, out, out / RESULTS_FILE)


def _progress(stream: TextIO, done: int, total: int) -> None:
    """A one-line counter on a terminal; nothing in logs (carriage returns make them unreadable)."""
    if stream.isatty():
        stream.write(f"\rpredict: {done}/{total} images")
        stream.flush()
