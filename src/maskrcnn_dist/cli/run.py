"""The commands that run the trainer: train, eval, and the demo (synthetic data, a short run, its report)."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any

import click

from .. import config as config_mod
from .options import collect, train_options


def _run_train(config_file: Path | None, values: dict[str, Any]):
    """train.train of the config these flags make (with the trained model of a checkpoint they name:
    modeling/trained.py), and on a stop request its closing line and EXIT_STOPPED (stop.py): a separate
    process only. The stop handlers go in before torch loads (seconds in which a SIGTERM would otherwise kill),
    and so does the parse of a large annotation file (those seconds on another core)."""
    from ..data.parse_ahead import parse_ahead
    from ..lifetime.stop import Stopped, exit_stopped, stop_on_signals

    cfg = config_mod.build_config(config_file, values)  # a bad flag or file is refused before torch loads
    # This process's one stop request; a finished run gives the signals back (a test's CliRunner, a later command).
    # A large annotation file is parsed while torch loads (data/parse_ahead.py); train() has it written.
    with stop_on_signals() as stop, parse_ahead(cfg) or contextlib.nullcontext() as parsing:
        from ..modeling.trained import records_evaluation, train_command_config
        from ..train import train as run_train

        try:
            cfg = train_command_config(config_file, values)
            record = not cfg.test_only or records_evaluation(config_file, values)
            return run_train(cfg, stop=stop, parsing=parsing, record=record)
        except Stopped as stopped:
            exit_stopped(stopped.closing_line())


@click.command()
@train_options
def train(config_file: Path | None, **kwargs: Any) -> None:
    """Train (flags named like torchvision's detection references). SIGTERM or SIGINT stops it after the
    step in progress with a checkpoint of that step, exit 75; a second one ends it at once."""
    result = _run_train(config_file, collect(kwargs))  # None on a pipeline stage worker
    if result is not None and result.eval:
        click.echo(json.dumps({"step": result.position.step, **result.eval}))


@click.command("eval")
@train_options
def eval_command(config_file: Path | None, **kwargs: Any) -> None:
    """COCO bbox/segm AP of a checkpoint (--resume: its model, sizes and dataset as trained; flags given
    override them) or weights file (--weights) on the val split, printed as JSON. With --output-dir (or
    --resume auto|best, which read it) the record joins that run's metrics; otherwise nothing is written."""
    result = _run_train(config_file, {**collect(kwargs), "test-only": True})
    click.echo(json.dumps(result.eval))


DEMO_GALLERY_IMAGES = 4  # a few seconds on CPU after training


@click.command()
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
    from ..outputs.report import draw_report

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
    from ..outputs.gallery import draw_gallery, gallery_path

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
