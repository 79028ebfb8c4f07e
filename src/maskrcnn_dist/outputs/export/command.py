"""`maskrcnn-dist export`: a checkpoint (or weights file) -> a TorchScript or ONNX file that passed its
parity check.

    check --out and the format's packages          (before any model is built)
    the model as predict builds it                 (the checkpoint's model settings and categories)
    the parity images                              (--images, else the val split of the run's dataset)
    write the file under a temporary name          (torchvision's modules, eval mode, fp32, CPU)
    run it and the eager model on every image      (parity.py: the table, the tolerances)
    pass: rename it to --out (and its metadata beside it); fail: keep it as OUT.failed, one error line

An export never replaces a good file with a failed one: --overwrite takes effect only on a pass.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torchvision

from ...config import ExportConfig
from ...data import open_split, read_image
from ...data.images.check import CheckRules
from ...data.images.orientation import Frame
from ...errors import ConfigError, DatasetError, ParityError, UserError, one_line
from ...modeling.model import build_model
from ...run_dir import output_file_problem, tmp_name
from ..inputs import InputImage, check_readable, collect_images, dataset_images
from ..predictor import Predictor, data_config, load_predictor
from .formats import FORMATS, ExportError, ExportFormat, quiet
from .parity import Cut, ImageParity, run_parity, table_lines, worst_problem

FAILED_SUFFIX = ".failed"


@dataclass
class ExportSummary:
    out: Path
    format: str
    seconds: float  # writing the file (scripting or tracing included)
    parity: list[ImageParity]
    metadata: str  # where the categories are, as the command's output says it

    def lines(self) -> list[str]:
        matched = sum(r.matched for r in self.parity)
        eager = sum(r.eager for r in self.parity)
        return [
            f"parity: {len(self.parity)} images, {matched} of {eager} eager detections matched, "
            f"max |dbox| {max(r.box_diff for r in self.parity):.2e} px, "
            f"max |dscore| {max(r.score_diff for r in self.parity):.2e}, "
            f"min mask IoU {min(r.mask_iou for r in self.parity):.4f}",
            f"wrote {self.out} ({self.format}, exported in {self.seconds:.1f} s); categories in {self.metadata}",
        ]


def check_out(out: Path, fmt: ExportFormat, overwrite: bool) -> Path | None:
    """--out must be a file name of the format's kind that can be written, and, without --overwrite, not
    exist (nor its sidecar). Returns the sidecar's path, if the format has one."""
    if problem := output_file_problem(out, "--out", fmt.suffixes):
        raise ConfigError(problem)
    _, sidecar = fmt.metadata_place(out)
    taken = [path for path in (out, sidecar) if path is not None and path.exists()]
    if taken and not overwrite:
        exist = "already exists" if len(taken) == 1 else "already exist"
        raise ConfigError(
            f"--out {out}: {' and '.join(str(p) for p in taken)} {exist}: add --overwrite to replace it "
            "(only once the new export passes its parity check), or choose another --out"
        )
    return sidecar


def parity_inputs(
    images: Sequence[Path], predictor: Predictor, flags: dict[str, Any], count: int
) -> tuple[list[InputImage], dict[int, Frame]]:
    """The first `count` of --images (files, folders), else of the val split of --data-path or of the
    dataset the checkpoint was trained on; each one checked as predict checks it (it opens, is whole,
    fits the model's resize), and the frame it is read in (the display frame: both models see the
    same tensor, so the frame does not change the comparison)."""
    rules = CheckRules.of(predictor.engine.cfg, mode="header")
    if images:
        try:
            chosen = collect_images(images)[:count]
            frames = check_readable(chosen, rules)
        except UserError as exc:
            raise DatasetError(f"--images {exc}") from exc
        return chosen, frames
    split_cfg = data_config(flags, predictor, rules.exif_orientation, default_to_checkpoint=True)
    if split_cfg is None:
        raise ConfigError(
            f"export: the parity check needs images, and {predictor.source} records no dataset: give --images FILE"
        )
    root = split_cfg.data.data_path or split_cfg.data.val_annotations or split_cfg.data.train_annotations
    try:
        chosen = dataset_images(open_split(split_cfg, "val"))[:count]
        frames = check_readable(chosen, rules)
    except UserError as exc:
        raise ConfigError(
            f"export: the parity check needs images, and the val split of {root} cannot be read "
            f"({exc}): give --images FILE"
        ) from exc
    if not chosen:
        raise ConfigError(f"export: the val split of {root} lists no images: give --images FILE")
    return chosen, frames


def exportable_model(predictor: Predictor) -> torch.nn.Module:
    """The predictor's model rebuilt from torchvision's own modules (model.build_model's `exportable`),
    with the same weights, in eval mode."""
    settings = predictor.engine.cfg.model
    # The weights come from the eager model; the BatchNorm kind stays the one its state dict was made with.
    settings = dataclasses.replace(
        settings, weights=None, weights_backbone=None, backbone_norm=settings.resolved_backbone_norm()
    )
    model = build_model(settings, predictor.categories.num_classes, exportable=True)
    model.load_state_dict(predictor.engine.model.state_dict())
    return model.eval()


def metadata(predictor: Predictor, fmt: ExportFormat) -> dict[str, Any]:
    """What a server needs beside the weights: the label -> category mapping and the model's settings."""
    settings = predictor.engine.cfg.model
    categories = predictor.categories
    return {
        "format": fmt.name,
        "model": settings.name,
        "min_size": settings.min_size,
        "max_size": settings.max_size,
        "num_classes": categories.num_classes,
        "categories": [
            {"label": label, "id": categories.ids[label], "name": categories.names[label]}
            for label in range(1, categories.num_classes)
        ],
        "source": predictor.source,
        "step": predictor.step,
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
    }


def export_model(
    options: ExportConfig, flags: dict[str, Any], images: Sequence[Path], echo: Callable[[str], None] = print
) -> ExportSummary:
    """Export the model of flags["resume"] / flags["weights"] (config.EXPORT_TRAIN_FLAGS) as
    `options.format` to `options.out`, after the parity check on `options.parity_images` images. The
    parity table goes to `echo`; a failed check raises ParityError and leaves OUT.failed."""
    assert options.format is not None and options.out is not None  # config.build_export_config requires them
    fmt, out = FORMATS[options.format], Path(options.out)
    sidecar = check_out(out, fmt, options.overwrite)
    fmt.check_available()
    predictor = load_predictor({**flags, "device": "cpu", "amp": False}, command="export")
    inputs, frames = parity_inputs(images, predictor, flags, options.parity_images)
    tensors = [read_image(item.path, frames[item.image_id])[0] for item in inputs]
    model = exportable_model(predictor)
    described = metadata(predictor, fmt)
    out.parent.mkdir(parents=True, exist_ok=True)  # once everything it needs has been found good
    tmp = out.with_name(tmp_name(out.name, os.getpid()))
    try:
        started = time.perf_counter()
        _write(fmt, model, tensors[0], tmp, described)
        seconds = time.perf_counter() - started
        results = _parity(fmt, tmp, predictor, model, inputs, tensors, out)
        for line in table_lines(results):
            echo(line)
        if (worst := worst_problem(results)) is not None:
            image, what = worst
            failed = _keep_failed(tmp, out)
            raise ParityError(
                f"export parity check failed on {sum(not r.ok for r in results)} of {len(results)} images; "
                f"worst: {image.name}: {what}; the {fmt.name} file is kept as {failed}, not as --out"
            )
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    if sidecar is not None:
        _write_text_atomically(sidecar, json.dumps(described, indent=2) + "\n")
    return ExportSummary(out, fmt.name, seconds, results, fmt.metadata_place(out)[0])


def _write(fmt: ExportFormat, model: torch.nn.Module, first: torch.Tensor, path: Path, described: dict) -> None:
    """The exported file. The example is the first parity image transposed (H and W swapped): every
    parity image then runs at a size the tracer did not see, unless it is square."""
    try:
        fmt.write(model, first.transpose(1, 2).contiguous(), path, described)
    except Exception as exc:  # an exporter's refusal, from deep inside torch: one line, no traceback
        raise ExportError(
            f"--format {fmt.name}: {described['model']} cannot be exported with torch {torch.__version__} "
            f"and torchvision {torchvision.__version__}: {one_line(exc)}"
        ) from exc


def _parity(
    fmt: ExportFormat,
    path: Path,
    predictor: Predictor,
    model: torch.nn.Module,
    inputs: list[InputImage],
    tensors: list[torch.Tensor],
    out: Path,
) -> list[ImageParity]:
    cut = Cut(float(model.roi_heads.score_thresh), int(model.roi_heads.detections_per_img))
    try:
        exported = fmt.load(path)
        with quiet():
            return run_parity(
                [item.name for item in inputs], tensors, lambda image: predictor.predict([image])[0], exported, cut
            )
    except Exception as exc:  # a file that does not load or run cannot pass
        failed = _keep_failed(path, out)
        raise ParityError(
            f"the exported {fmt.name} file does not run: {one_line(exc)}; it is kept as {failed}, not as --out"
        ) from exc


def _keep_failed(tmp: Path, out: Path) -> Path:
    failed = out.with_name(out.name + FAILED_SUFFIX)
    os.replace(tmp, failed)
    return failed


def _write_text_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(tmp_name(path.name, os.getpid()))
    tmp.write_text(text)
    os.replace(tmp, path)
