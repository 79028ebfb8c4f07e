"""The tools beside the run: report (curves, --gallery), status (the launcher's), profile, predict, export."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click

from .. import config as config_mod
from .options import collect, field_options


@click.command()
@click.option(
    "--metrics",
    "metrics_file",
    type=click.Path(path_type=Path),
    required=True,
    help="a run's OUTPUT_DIR, or its metrics.jsonl",
)
@click.option(
    "--out",
    "out_png",
    type=click.Path(path_type=Path),
    default=None,
    help="PNG to write (default: next to the metrics file)",
)
@click.option(
    "--gallery",
    type=click.IntRange(0, config_mod.GALLERY_MAX),
    default=0,
    show_default=True,
    help="also draw N validation images: predictions | truth",
)
@field_options(tuple(config_mod.BY_FLAG[flag] for flag in ("resume", "data-path")))
def report(metrics_file: Path, out_png: Path | None, gallery: int, resume: Path | None, data_path: Path | None) -> None:
    """Draw loss and AP curves of a run into a PNG; with --gallery N --resume CKPT, predictions on N
    validation images beside their ground truth into a second PNG (report_gallery.png)."""
    from ..outputs.report import draw_report, metrics_path

    metrics_file = metrics_path(metrics_file)
    if gallery:  # a gallery that cannot be drawn fails before the report is written
        from ..checkpoint import resolve_resume
        from ..outputs.gallery import check_gallery_request

        check_gallery_request(resume, gallery)
        # --resume auto|best: a checkpoint of the run whose metrics these are
        resume = resolve_resume(resume, metrics_file.parent, must_exist=True)
    path = draw_report(metrics_file, out_png or metrics_file.with_name("report.png"))
    click.echo(str(path))
    if gallery:
        from ..outputs.gallery import draw_gallery, gallery_path

        click.echo(str(draw_gallery(resume, gallery, gallery_path(path), data_path)))


@click.command(context_settings={"ignore_unknown_options": True, "help_option_names": []})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def status(args: tuple[str, ...]) -> None:
    """Pods of a deployed release and the master's progress, or (--trainjob NAME) a Kubeflow Trainer
    TrainJob's state, progress and AP: runs `maskrcnn-launch status ARGS`.

    The Kubernetes client lives on the launcher's side (no torch); this keeps the command where
    trainer users look for it without importing the launcher."""
    os.execv(sys.executable, [sys.executable, "-m", "maskrcnn_launcher", "status", *args])


@click.command()
@field_options(config_mod.PROFILE_FIELDS + tuple(config_mod.BY_FLAG[f] for f in config_mod.PROFILE_TRAIN_FLAGS))
def profile(**kwargs: Any) -> None:
    """Measure each module on this device; rank ddp and every pipeline split and replica count of the
    topology by predicted images/s; say which to choose and why (--write-topology: write it).

    Images of the topology's estimate.image_size with its instances_per_image; the batch, micro-batches,
    model, precision, device and threads are the train flags of the same names."""
    from ..profile.command import profile as run_profile

    values = collect(kwargs)
    options = config_mod.build_profile_config({flag: values.pop(flag) for flag in config_mod.PROFILE_BY_FLAG})
    cfg = config_mod.build_config(None, values, for_engine=False)  # it weighs every engine
    report = run_profile(cfg, options)
    for line in report.lines():
        click.echo(line)
    if options.write_topology is not None:
        click.echo(f"topology written: {options.write_topology}")
    if options.write_values is not None:
        click.echo(f"chart values written: {options.write_values}")


@click.command()
@field_options(config_mod.PREDICT_FIELDS + tuple(config_mod.BY_FLAG[f] for f in config_mod.PREDICT_TRAIN_FLAGS))
@click.argument("inputs", nargs=-1, type=click.Path(path_type=Path))
def predict(inputs: tuple[Path, ...], **kwargs: Any) -> None:
    """Draw a model's detections on images and write them as COCO results (detections.json).

    INPUTS are image files and folders (searched recursively), or --data-path with --split. The model
    is --resume CHECKPOINT (built with the settings it was trained with) or --weights FILE (built from
    --model, --min-size, --max-size). Labels are the categories the checkpoint stores, or "class k"."""
    from ..outputs.predict import predict_images

    values = collect(kwargs)
    options = config_mod.build_predict_config({flag: values.pop(flag) for flag in config_mod.PREDICT_BY_FLAG})
    flags = {flag: value for flag, value in values.items() if value is not None}
    summary = predict_images(list(inputs), options, flags)
    click.echo(
        f"{summary.images} images, {summary.drawn} detections drawn (score >= {options.score_threshold:g}), "
        f"{summary.detections} in {summary.results}"
    )


@click.command()
@field_options(config_mod.EXPORT_FIELDS + tuple(config_mod.BY_FLAG[f] for f in config_mod.EXPORT_TRAIN_FLAGS))
@click.option(
    "--images",
    multiple=True,
    type=click.Path(path_type=Path),
    help="image file or folder for the parity check (repeatable; default: the val split the checkpoint trained with)",
)
def export(images: tuple[Path, ...], **kwargs: Any) -> None:
    """Write a checkpoint's model (--resume CKPT|best, or --weights FILE) as TorchScript or ONNX, with
    dynamic image sizes and its categories beside it, and check it: the exported and the eager model run
    on --parity-images images, and the export fails, keeping OUT.failed, when their detections differ."""
    from ..outputs.export import export_model

    values = collect(kwargs)
    options = config_mod.build_export_config({flag: values.pop(flag) for flag in config_mod.EXPORT_BY_FLAG})
    flags = {flag: value for flag, value in values.items() if value is not None}
    summary = export_model(options, flags, list(images), echo=click.echo)
    for line in summary.lines():
        click.echo(line)
