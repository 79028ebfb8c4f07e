"""`maskrcnn-dist`: a thin click layer over the library (config/, train.py, data/, outputs/, profile/)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import click
from maskrcnn_launcher.contract import GuardedGroup

from . import config as config_mod
from .errors import classify as classify_error


class _FieldType(click.ParamType):
    """A config field's one converter (config.FieldSpec.parse), so the CLI and YAML files agree."""

    def __init__(self, spec: config_mod.FieldSpec) -> None:
        self.spec = spec
        self.name = spec.type_name

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            parsed = self.spec.parse(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        # A choice is part of the type, as with click.Choice: commands that build no TrainConfig
        # (check-data, report) never run its validation, and an unknown mode must not reach the library.
        if self.spec.choices is not None and parsed is not None and parsed not in self.spec.choices:
            self.fail(f"{parsed!r} is not one of {', '.join(self.spec.choices)}", param, ctx)
        return parsed


def field_options(specs: tuple[config_mod.FieldSpec, ...]):
    """click options for config fields (default None: "not given", so YAML and saved values can fill in)."""

    def decorate(func):
        for spec in reversed(specs):
            if spec.kind is bool:
                func = click.option(f"--{spec.flag}/--no-{spec.flag}", _param(spec), default=None, help=spec.help)(func)
            else:
                func = click.option(
                    f"--{spec.flag}", _param(spec), type=_FieldType(spec), default=None, help=_help(spec)
                )(func)
        return func

    return decorate


def train_options(func):
    """Every train flag, generated from config.FIELDS so flags and YAML keys can never drift apart."""
    func = field_options(config_mod.FIELDS)(func)
    return click.option(
        "--config",
        "config_file",
        type=click.Path(path_type=Path),
        help="YAML file of flag names -> values (flags given here win)",
    )(func)


def _help(spec: config_mod.FieldSpec) -> str:
    bounds = spec.bounds.describe()
    return f"{spec.help} [{bounds}]" if bounds else spec.help


def _param(spec: config_mod.FieldSpec) -> str:
    return spec.flag.replace("-", "_")


def _collect(kwargs: dict[str, Any]) -> dict[str, Any]:
    """click's keyword arguments back to flag names."""
    return {key.replace("_", "-"): value for key, value in kwargs.items()}


def _setup_logging(verbose: bool) -> None:
    rank = os.environ.get("RANK")
    prefix = f"[rank {rank}] " if rank is not None else ""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format=f"%(asctime)s {prefix}%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


@click.group(
    cls=GuardedGroup,
    classify=classify_error,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110},
)
@click.option("-v", "--verbose", is_flag=True, help="debug logging")
def main(verbose: bool) -> None:
    """Train torchvision's Mask R-CNN on one machine or several (ddp, pipeline)."""
    _setup_logging(verbose)


def _run_train(config_file: Path | None, values: dict[str, Any]):
    """train.train of the config these flags make (with the trained model of a checkpoint they name:
    modeling/trained.py), and on a stop request its closing line and EXIT_STOPPED (stop.py): a separate
    process only. The stop handlers go in before torch loads (seconds in which a SIGTERM would otherwise kill),
    and so does the parse of a large annotation file (those seconds on another core)."""
    from .data.parse_ahead import parse_ahead
    from .lifetime.stop import Stopped, exit_stopped, stop_on_signals

    cfg = config_mod.build_config(config_file, values)  # a bad flag or file is refused before torch loads
    # This process's one stop request; a finished run gives the signals back (a test's CliRunner, a later command).
    # A large annotation file is parsed while torch loads (data/parse_ahead.py); train() has it written.
    with stop_on_signals() as stop, parse_ahead(cfg) or contextlib.nullcontext() as parsing:
        from .modeling.trained import records_evaluation, train_command_config
        from .train import train as run_train

        try:
            cfg = train_command_config(config_file, values)
            record = not cfg.test_only or records_evaluation(config_file, values)
            return run_train(cfg, stop=stop, parsing=parsing, record=record)
        except Stopped as stopped:
            exit_stopped(stopped.closing_line())


@main.command()
@train_options
def train(config_file: Path | None, **kwargs: Any) -> None:
    """Train (flags named like torchvision's detection references). SIGTERM or SIGINT stops it after the
    step in progress with a checkpoint of that step, exit 75; a second one ends it at once."""
    result = _run_train(config_file, _collect(kwargs))  # None on a pipeline stage worker
    if result is not None and result.eval:
        click.echo(json.dumps({"step": result.position.step, **result.eval}))


@main.command("eval")
@train_options
def eval_command(config_file: Path | None, **kwargs: Any) -> None:
    """COCO bbox/segm AP of a checkpoint (--resume: its model, sizes and dataset as trained; flags given
    override them) or weights file (--weights) on the val split, printed as JSON. With --output-dir (or
    --resume auto|best, which read it) the record joins that run's metrics; otherwise nothing is written."""
    result = _run_train(config_file, {**_collect(kwargs), "test-only": True})
    click.echo(json.dumps(result.eval))


@main.command("synth-data")
@click.option("--output", type=click.Path(path_type=Path), required=True, help="folder to write train/ and val/ into")
@click.option("--train-images", type=click.IntRange(1, 1_000_000), default=64, show_default=True)
@click.option("--val-images", type=click.IntRange(1, 1_000_000), default=16, show_default=True)
@click.option(
    "--image-size", type=click.IntRange(32, 4096), default=128, show_default=True, help="largest side, pixels"
)
@click.option("--classes", type=click.IntRange(1, 5), default=3, show_default=True, help="number of shape classes")
@click.option("--max-objects", type=click.IntRange(1, 64), default=4, show_default=True)
@click.option("--seed", type=click.IntRange(0, config_mod.INT64_MAX), default=0, show_default=True)
def synth_data(
    output: Path,
    train_images: int,
    val_images: int,
    image_size: int,
    classes: int,
    max_objects: int,
    seed: int,
) -> None:
    """Write a deterministic synthetic COCO instance-segmentation set (real PNGs + instances JSON)."""
    from .data import write_train_val
    from .errors import ConfigError
    from .run_dir import output_folder_problem

    if problem := output_folder_problem(output, "--output"):
        raise ConfigError(problem)
    if taken := [split for split in ("train", "val") if (output / split).exists()]:
        raise ConfigError(
            f"--output {output} already holds {' and '.join(taken)}/: the new set would be written over it"
        )
    try:
        splits = write_train_val(
            output,
            num_train=train_images,
            num_val=val_images,
            seed=seed,
            image_size=(int(image_size * 0.75), image_size),
            num_classes=classes,
            max_objects=max_objects,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    click.echo(f"train: {splits.train.annotation_file}\nval:   {splits.val.annotation_file}")


CHECK_DATA_FLAGS = (*config_mod.DATA_SOURCE_FLAGS, "seed", "check-data", "exif-orientation", "min-size", "max-size")


@main.command("check-data")
@field_options(tuple(config_mod.BY_FLAG[flag] for flag in CHECK_DATA_FLAGS))
@click.option(
    "--split", type=click.Choice(["train", "val", "both"]), default="both", show_default=True, help="splits to check"
)
def check_data(split: str, **kwargs: Any) -> None:
    """Show what a dataset holds (the layout found or the flags, per split the files and images, the
    classes with instance and crowd counts, placeholders left out) and check every image as training
    does at start (--check-data, default header; the frame --exif-orientation reads it in; its size after
    the model's --min-size/--max-size resize): prints each bad file and a summary per split; exit 2 when
    any image is bad."""
    from .data import check_split, raise_if_bad

    cfg = config_mod.build_config(None, _collect(kwargs))
    splits = ("train", "val") if split == "both" else (split,)
    opened, reports = check_split(cfg, splits)
    click.echo(f"dataset: {opened.sources.layout}")
    for name, split in opened.splits.items():
        click.echo(f"{name}: {split.source.describe()}, {len(split)} images")
    for line in opened.classes.lines(cfg.data.crowd_as_instances):
        click.echo(line)
    for report in reports:
        for bad in report.bad:
            click.echo(f"bad: {bad}")
        click.echo(report.summary())
    raise_if_bad(reports)


@main.command()
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
    from .outputs.report import draw_report, metrics_path

    metrics_file = metrics_path(metrics_file)
    if gallery:  # a gallery that cannot be drawn fails before the report is written
        from .checkpoint import resolve_resume
        from .outputs.gallery import check_gallery_request

        check_gallery_request(resume, gallery)
        # --resume auto|best: a checkpoint of the run whose metrics these are
        resume = resolve_resume(resume, metrics_file.parent, must_exist=True)
    path = draw_report(metrics_file, out_png or metrics_file.with_name("report.png"))
    click.echo(str(path))
    if gallery:
        from .outputs.gallery import draw_gallery, gallery_path

        click.echo(str(draw_gallery(resume, gallery, gallery_path(path), data_path)))


@main.command(context_settings={"ignore_unknown_options": True, "help_option_names": []})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def status(args: tuple[str, ...]) -> None:
    """Pods of a deployed release and the master's progress, or (--trainjob NAME) a Kubeflow Trainer
    TrainJob's state, progress and AP: runs `maskrcnn-launch status ARGS`.

    The Kubernetes client lives on the launcher's side (no torch); this keeps the command where
    trainer users look for it without importing the launcher."""
    os.execv(sys.executable, [sys.executable, "-m", "maskrcnn_launcher", "status", *args])


DEMO_GALLERY_IMAGES = 4  # a few seconds on CPU after training


@main.command()
@click.option("--output-dir", type=click.Path(path_type=Path), default=Path("runs/demo"), show_default=True)
@click.option(
    "--steps", type=click.IntRange(1, config_mod.INT64_MAX), default=120, show_default=True, help="optimizer steps"
)
@click.option(
    "--engine",
    type=click.Choice(["pipeline", "local"]),
    default="pipeline",
    show_default=True,
    help="pipeline: master, worker 1 and worker 2 as three launcher processes on loopback",
)
def demo(output_dir: Path, steps: int, engine: str) -> None:
    """The embedded default: synthetic COCO, small Mask R-CNN, CPU, short schedule, evaluation, report, gallery.

    With the pipeline engine this is the three-machine job on one machine: `maskrcnn-launch local`
    starts the master and both stage workers with explicit identities on 127.0.0.1.
    """
    from .outputs.report import draw_report

    flags = config_mod.demo_flags(output_dir, steps, engine)
    if engine == "pipeline":
        # The launcher picks a free loopback port and gives every pod its identity and the engine.
        del flags["engine"]
        runner = [sys.executable, "-m", "maskrcnn_launcher", "local", "--", *config_mod.to_argv(flags)]
        code = _run_passing_signals_on(runner)
        if code:
            sys.exit(code)
    else:
        _run_train(None, flags)
    png = draw_report(output_dir / "metrics.jsonl", output_dir / "report.png")
    click.echo(f"report: {png}")
    from .outputs.gallery import draw_gallery, gallery_path

    shown = draw_gallery(output_dir / "checkpoints", DEMO_GALLERY_IMAGES, gallery_path(png))
    click.echo(f"gallery: {shown}")


def _run_passing_signals_on(argv: list[str]) -> int:
    """Run `argv` in a session of its own and pass each SIGTERM/SIGINT this process gets on to it once
    (a terminal's Ctrl-C reaches only this process: `maskrcnn-launch local` stops its pods itself)."""
    import subprocess

    from maskrcnn_launcher.contract import STOP_SIGNALS, signal_handlers

    child = subprocess.Popen(argv, start_new_session=True)
    with signal_handlers(dict.fromkeys(STOP_SIGNALS, lambda signum, _: child.send_signal(signum))):
        return child.wait()


@main.command()
@field_options(config_mod.PROFILE_FIELDS + tuple(config_mod.BY_FLAG[f] for f in config_mod.PROFILE_TRAIN_FLAGS))
def profile(**kwargs: Any) -> None:
    """Measure each module on this device; rank ddp and every pipeline split and replica count of the
    topology by predicted images/s; say which to choose and why (--write-topology: write it).

    Images of the topology's estimate.image_size with its instances_per_image; the batch, micro-batches,
    model, precision, device and threads are the train flags of the same names."""
    from .profile.command import profile as run_profile

    values = _collect(kwargs)
    options = config_mod.build_profile_config({flag: values.pop(flag) for flag in config_mod.PROFILE_BY_FLAG})
    cfg = config_mod.build_config(None, values, for_engine=False)  # it weighs every engine
    report = run_profile(cfg, options)
    for line in report.lines():
        click.echo(line)
    if options.write_topology is not None:
        click.echo(f"topology written: {options.write_topology}")
    if options.write_values is not None:
        click.echo(f"chart values written: {options.write_values}")


@main.command()
@field_options(config_mod.PREDICT_FIELDS + tuple(config_mod.BY_FLAG[f] for f in config_mod.PREDICT_TRAIN_FLAGS))
@click.argument("inputs", nargs=-1, type=click.Path(path_type=Path))
def predict(inputs: tuple[Path, ...], **kwargs: Any) -> None:
    """Draw a model's detections on images and write them as COCO results (detections.json).

    INPUTS are image files and folders (searched recursively), or --data-path with --split. The model
    is --resume CHECKPOINT (built with the settings it was trained with) or --weights FILE (built from
    --model, --min-size, --max-size). Labels are the categories the checkpoint stores, or "class k"."""
    from .outputs.predict import predict_images

    values = _collect(kwargs)
    options = config_mod.build_predict_config({flag: values.pop(flag) for flag in config_mod.PREDICT_BY_FLAG})
    flags = {flag: value for flag, value in values.items() if value is not None}
    summary = predict_images(list(inputs), options, flags)
    click.echo(
        f"{summary.images} images, {summary.drawn} detections drawn (score >= {options.score_threshold:g}), "
        f"{summary.detections} in {summary.results}"
    )


@main.command()
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
    from .outputs.export import export_model

    values = _collect(kwargs)
    options = config_mod.build_export_config({flag: values.pop(flag) for flag in config_mod.EXPORT_BY_FLAG})
    flags = {flag: value for flag, value in values.items() if value is not None}
    summary = export_model(options, flags, list(images), echo=click.echo)
    for line in summary.lines():
        click.echo(line)


if __name__ == "__main__":
    main()
