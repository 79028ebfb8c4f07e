"""Predict: images (files, folders, or a dataset split) -> detections -> drawings and COCO results.

The model comes from a checkpoint (--resume) or a weights file (--weights) the way `eval` gets it: the
train flags through config.build_config, model.build_model inside the local engine, whose `predict`
runs under perf.autocast_context and returns CPU detections in original image coordinates. The results
are evaluation.detections_to_coco's records, the ones `eval` scores: on a dataset split, with the same
batches, detections.json scores exactly `eval`'s AP.

Frames (data/images/orientation.py): every image is read in the frame the data check decides for it, so
detections.json is in the annotation file's frame for a split, and in the display frame for files
given by themselves; the drawings are turned into the display frame.
"""

from __future__ import annotations

import json
import logging
import math
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import torch
from PIL import Image

from ..categories import Categories
from ..checkpoint import load_checkpoint, resolve_resume
from ..config import DATA_SOURCE_FLAGS, PredictConfig, TrainConfig, build_config
from ..data import CocoInstanceDataset, build_eval_loader, open_split, read_image
from ..data.images.check import CheckRules, ImageEntry, check_images
from ..data.images.orientation import Frame, to_display
from ..engines.torch_engine import TorchEngine
from ..errors import CheckpointError, ConfigError, DatasetError, UserError, one_line
from ..evaluation import detections_to_coco
from ..modeling.model import CLASS_SCORE_WEIGHT, read_state_dict, state_num_classes
from ..modeling.perf import setup_process
from ..modeling.trained import TrainedModel, config_for
from ..run_dir import REPLACED_PREFIX, move_aside, output_folder_problem, replaced_stamp
from .draw import draw_detections, to_uint8

log = logging.getLogger(__name__)

RESULTS_FILE = "detections.json"  # COCO results: a list of {image_id, category_id, bbox, score, segmentation}
IMAGES_FILE = "images.json"  # COCO images + categories, so that COCO(IMAGES_FILE).loadRes(RESULTS_FILE) works
# Files of these kinds are taken from folders (recursively); a file named on the command line is always read.
IMAGE_SUFFIXES = (".bmp", ".gif", ".jpeg", ".jpg", ".png", ".tif", ".tiff", ".webp")
# Drawings of images smaller than this (short side, pixels) are enlarged, so that captions stay legible.
LEGIBLE_SIDE = 256
NOTHING_PREDICTED = "fix or remove them; nothing was predicted"


@dataclass
class Predictor:
    """A model ready to predict, with what its labels mean."""

    engine: TorchEngine
    categories: Categories  # the checkpoint's, or "class k" by index
    source: str  # "checkpoint PATH" / "weights file PATH": how messages name it
    trained: TrainedModel | None  # what the checkpoint records of the model (None for plain weights files)
    step: int | None = None  # the checkpoint's optimizer steps

    def predict(self, images: list[torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        return self.engine.predict(images)

    def categories_for(self, dataset: CocoInstanceDataset | None) -> Categories:
        """The dataset's categories (real COCO ids) when there is one, which must be as many as the model's."""
        if dataset is None:
            return self.categories
        theirs = Categories.of_dataset(dataset)
        if theirs.num_classes != self.categories.num_classes:
            raise DatasetError(
                f"{dataset.annotation_file}: {theirs.num_classes - 1} categories, but {self.source} "
                f"was trained for {self.categories.num_classes - 1}"
            )
        return theirs

    def trained_data_flags(self) -> dict[str, Any]:
        """The data flags the checkpoint's run found its dataset by (and its --seed); empty where it
        records none (a plain weights file)."""
        return dict(self.trained.data_flags) if self.trained is not None else {}


def load_predictor(flags: dict[str, Any], command: str = "predict") -> Predictor:
    """The model of `flags["resume"]` (a checkpoint; "auto" and "best" name one of the run in
    flags["output-dir"]) or `flags["weights"]` (a state dict, or a kit checkpoint), rebuilt from what it
    records (modeling/trained.py) with the train flags in `flags` over it."""
    resume, weights = flags.get("resume"), flags.get("weights")
    if (resume is None) == (weights is None):
        raise ConfigError(f"{command} needs one of --resume CHECKPOINT or --weights FILE")
    if resume is not None:
        resume = resolve_resume(resume, flags.get("output-dir") or TrainConfig().output_dir, must_exist=True)
        flags = {**flags, "resume": resume}
        source, reading = f"checkpoint {resume}", f"--resume {resume}"
        state = load_checkpoint(Path(resume))
        model_state, step = state["model"], state.get("step")
        trained: TrainedModel | None = TrainedModel.from_checkpoint(state, source)
    else:
        source, reading = f"weights file {weights}", f"--weights {weights}"
        model_state, step = read_state_dict(Path(weights), "weights"), None
        trained = TrainedModel.of_weights_file(Path(weights))
    num_classes = state_num_classes(model_state)
    if num_classes is None:
        raise CheckpointError(f"{source} is not a Mask R-CNN model: it has no {CLASS_SCORE_WEIGHT}")
    cfg = config_for(flags, None, trained, reading)
    setup_process(cfg)  # --threads and denormal flushing, as for eval
    # With --weights, build_model loads the file (eval's path); its class count is the file's, so nothing is skipped.
    engine = TorchEngine(cfg, num_classes, iters_per_epoch=1)
    if resume is not None:
        try:
            engine.load_state_dict({"model": model_state})
        except (KeyError, RuntimeError, ValueError) as exc:
            raise CheckpointError(f"{source} does not fit the model {cfg.model.name}: {one_line(exc)}") from exc
    categories = trained.categories if trained is not None else None
    return Predictor(engine, categories or Categories.by_index(num_classes), source, trained, step)


# ---------------------------------------------------------------------------------------------------
# inputs


@dataclass(frozen=True)
class InputImage:
    image_id: int
    path: Path
    name: str  # the drawing's file name without suffix, unique within a run


def collect_images(inputs: Sequence[Path], out: Path | None = None) -> list[InputImage]:
    """Image files as given, and the image files in given folders and their subfolders, sorted; ids 1..N
    in that order. A folder is searched outside an `out` inside it: a second run into a folder inside
    its input folder must not predict its own drawings. `out` may not be an input folder itself (its
    drawings would mix with the images)."""
    paths: list[Path] = []
    for given in map(Path, inputs):
        if given.is_dir():
            skip = _output_inside(given, out)
            found = sorted(
                p
                for p in given.rglob("*")
                if p.is_file()
                and p.suffix.lower() in IMAGE_SUFFIXES
                and not (skip is not None and p.resolve().is_relative_to(skip))
            )
            if not found:
                raise UserError(f"{given}: no image files ({' '.join(IMAGE_SUFFIXES)}) in this folder or below")
            paths += found
        elif given.is_file():
            paths.append(given)  # named explicitly: read whatever it is; a non-image fails with its name
        else:
            raise UserError(f"{given}: no such file or folder")
    return _named(list(enumerate(paths, start=1)))


def _output_inside(folder: Path, out: Path | None) -> Path | None:
    """`out`, resolved, when it is a folder strictly inside input `folder` (its files are skipped)."""
    if out is None:
        return None
    inner, outer = Path(out).resolve(), folder.resolve()
    if inner == outer:
        raise UserError(
            f"--out {out} is the input folder {folder} itself: the drawings would mix with its images; "
            "choose another --out (a folder inside it is fine)"
        )
    return inner if inner.is_relative_to(outer) else None


def dataset_images(dataset: CocoInstanceDataset) -> list[InputImage]:
    """A split's images in dataset order (the order of eval's loader)."""
    return _named(list(zip(dataset.image_ids, dataset.file_names(), strict=True)))


def _named(items: list[tuple[int, Path]]) -> list[InputImage]:
    """Drawing names: the file's stem, or stem-<id> where stems repeat (a/x.png and b/x.png). Compared
    case-folded (X.png and x.png are one file on some file systems), and a name another image already
    took (a second x, and a file called x-2) gets the id again, so no drawing replaces another."""
    stems = Counter(path.stem.casefold() for _, path in items)
    taken: set[str] = set()
    named = []
    for iid, path in items:
        name = path.stem if stems[path.stem.casefold()] == 1 else f"{path.stem}-{iid}"
        while name.casefold() in taken:
            name = f"{name}-{iid}"
        taken.add(name.casefold())
        named.append(InputImage(iid, path, name))
    return named


def check_readable(images: list[InputImage], rules: CheckRules) -> dict[int, Frame]:
    """Image files given by themselves: each opens, is whole and fits the model's resize (data/images/
    check.py's check by `rules`), before anything is written. The frames decided, by image id."""
    report = check_images([ImageEntry(i.image_id, i.path) for i in images], rules)
    if report.bad:  # files named by the user: the first one by its name alone, as read_image names it
        bad = report.bad
        more = f" (and {len(bad) - 1} more bad images)" if len(bad) > 1 else ""
        raise DatasetError(f"{bad[0].path}: {bad[0].reason}{more}")
    return dict(report.frames)


def dataset_frames(dataset: CocoInstanceDataset, images: list[InputImage]) -> dict[int, Frame]:
    """The frames a split's images are read in (open_split's check decided them), by image id."""
    return {item.image_id: dataset.frame(item.image_id) for item in images}


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


def data_config(
    flags: dict[str, Any], predictor: Predictor, exif_orientation: str, *, default_to_checkpoint: bool
) -> TrainConfig | None:
    """A config naming the dataset to read: the data flags given (a carve's --seed defaulting to the
    checkpoint's, so a --val-fraction split is the one it trained with), else, with
    `default_to_checkpoint`, the data the checkpoint was trained on; None when neither names one."""
    saved = predictor.trained_data_flags()
    given = {flag: flags[flag] for flag in (*DATA_SOURCE_FLAGS, "seed") if flags.get(flag) is not None}
    if not any(flag in given for flag in DATA_SOURCE_FLAGS):
        if not default_to_checkpoint or not saved:
            return None
        given = {**saved, **given}
    elif "seed" in saved:
        given.setdefault("seed", saved["seed"])
    return build_config(None, {**given, "exif-orientation": exif_orientation})


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
