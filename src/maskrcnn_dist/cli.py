"""`maskrcnn-dist`: a thin click layer over the library (train.py, data, report)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import click

from . import config as config_mod
from .errors import TrainingError, UserError

HELP = {
    "engine": "local (one process), ddp (DistributedDataParallel, under torchrun or the launcher), "
    "pipeline (model parallel over RPC, under the launcher)",
    "epochs": "number of epochs",
    "max-steps": "stop after this many optimizer steps in total",
    "seed": "seed for weights, data order, flips and sampling",
    "output-dir": "metrics, checkpoints, report",
    "device": "auto, cpu or cuda",
    "threads": "CPU threads per process (torch.set_num_threads)",
    "amp": "mixed precision: bf16 autocast on CPU, fp16 + grad scaler on CUDA (see --amp-dtype); "
    "losses, RoI ops, box decoding and the optimizer stay fp32",
    "amp-dtype": "autocast dtype under --amp: auto (bf16 on CPU, fp16 on CUDA), bfloat16 or float16",
    "flush-denormal": "flush denormal floats to zero on CPU (3-6x slower iterations without it)",
    "resume": "checkpoint file, directory, or 'auto' (newest in OUTPUT_DIR/checkpoints, if any)",
    "test-only": "only evaluate (with --resume or --weights)",
    "print-freq": "log every N steps",
    "val-period": "validation loss every N steps (0: at epoch ends only)",
    "checkpoint-period": "checkpoint every N steps (0: at epoch ends only)",
    "keep-checkpoints": "keep the newest K checkpoints",
    "eval-every-epoch": "COCO AP at every epoch end",
    "data-path": "COCO root: {train,val}/annotations.json + images/, or annotations/instances_*2017.json",
    "synthetic-images": "generate a synthetic COCO set of N training images (at --data-path or OUTPUT_DIR/data)",
    "synthetic-image-size": "largest side of the synthetic images, pixels",
    "batch-size": "images per step per process",
    "val-batch-size": "images per evaluation batch",
    "workers": "DataLoader worker processes",
    "aspect-ratio-group-factor": "group images by aspect ratio into batches (-1: off)",
    "model": "maskrcnn_resnet50_fpn, maskrcnn_resnet50_fpn_v2 or maskrcnn_resnet18_fpn (small, for CPU)",
    "min-size": "resize so the short side is this many pixels",
    "max-size": "... and the long side at most this",
    "weights": "local file of Mask R-CNN weights (class-dependent layers re-initialised if the class count differs)",
    "weights-backbone": "local file of ResNet (ImageNet) weights",
    "trainable-backbone-layers": "0-5 backbone stages to train (default 3 with weights, else 5)",
    "backbone-norm": "auto, frozen or batch BatchNorm in the backbone",
    "channels-last": "channels_last (NHWC) memory format for the backbone, FPN and RPN head (fast bf16 convolutions)",
    "lr": "base learning rate",
    "momentum": "SGD momentum",
    "weight-decay": "SGD weight decay",
    "lr-steps": "epochs at which the rate is multiplied by --lr-gamma, comma separated",
    "lr-gamma": "decay factor at each of --lr-steps",
    "warmup-iters": "linear warm-up steps",
    "warmup-factor": "starting fraction of the rate during warm-up",
    "clip-grad-norm": "clip the global gradient norm to this value",
    "micro-batches": "pipeline: micro-batches per batch",
    "bf16-transport": "pipeline: send features in bfloat16",
    "rpc-timeout": "seconds before a silent peer counts as lost (RPC and process-group timeouts)",
    "join-timeout": "pipeline: seconds to wait for every process to join RPC before exiting non-zero",
}


def _click_type(section: str | None, name: str) -> tuple[Any, bool]:
    """(click type, is_flag) of a config field, from its dataclass annotation."""
    owner = (
        config_mod.TrainConfig
        if section is None
        else {
            "data": config_mod.DataConfig,
            "model": config_mod.ModelConfig,
            "optim": config_mod.OptimConfig,
            "pipeline": config_mod.PipelineConfig,
        }[section]
    )
    hint = str({f.name: f.type for f in dataclasses.fields(owner)}[name])
    if hint == "bool":
        return None, True
    if "Path" in hint and name != "resume":
        return click.Path(path_type=Path), False
    if "tuple" in hint:
        return str, False
    if "float" in hint:
        return float, False
    if "int" in hint:
        return int, False
    return str, False


def train_options(func):
    """Every train flag, generated from config.FLAGS so flags and YAML keys can never drift apart."""
    for flag, (section, name) in reversed(list(config_mod.FLAGS.items())):
        kind, is_flag = _click_type(section, name)
        if is_flag:
            func = click.option(
                f"--{flag}/--no-{flag}",
                name.replace("-", "_") + "__" + (section or ""),
                default=None,
                help=HELP[flag],
            )(func)
        else:
            func = click.option(f"--{flag}", name + "__" + (section or ""), type=kind, default=None, help=HELP[flag])(
                func
            )
    return click.option(
        "--config",
        "config_file",
        type=click.Path(path_type=Path),
        help="YAML file of flag names -> values (flags given here win)",
    )(func)


def _collect(kwargs: dict[str, Any]) -> dict[str, Any]:
    by_field = {(section or "", name): flag for flag, (section, name) in config_mod.FLAGS.items()}
    values = {}
    for key, value in kwargs.items():
        name, _, section = key.rpartition("__")
        values[by_field[(section, name)]] = value
    return values


def _setup_logging(verbose: bool) -> None:
    rank = os.environ.get("RANK")
    prefix = f"[rank {rank}] " if rank is not None else ""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format=f"%(asctime)s {prefix}%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def _run(func, *args: Any) -> Any:
    """Turn the errors a user can act on into one line and an exit code, never a deep traceback."""
    try:
        return func(*args)
    except UserError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except TrainingError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.option("-v", "--verbose", is_flag=True, help="debug logging")
def main(verbose: bool) -> None:
    """Train torchvision's Mask R-CNN on one machine or several (ddp, pipeline)."""
    _setup_logging(verbose)


@main.command()
@train_options
def train(config_file: Path | None, **kwargs: Any) -> None:
    """Train (flags named like torchvision's detection references)."""
    from .train import train as run_train

    cfg = _run(config_mod.build_config, config_file, _collect(kwargs))
    if cfg.engine == "pipeline":
        from .engines.pipeline import run_pipeline_from_env

        result = _run(run_pipeline_from_env, cfg)
    else:
        result = _run(run_train, cfg)
    if result is not None and result.eval:
        click.echo(json.dumps({"step": result.position.step, **result.eval}))


@main.command("eval")
@train_options
def eval_command(config_file: Path | None, **kwargs: Any) -> None:
    """COCO bbox/segm AP of a checkpoint (--resume) or weights file (--weights) on the val split."""
    from .train import train as run_train

    values = {**_collect(kwargs), "test-only": True}
    cfg = _run(config_mod.build_config, config_file, values)
    result = _run(run_train, cfg)
    click.echo(json.dumps(result.eval))


@main.command("synth-data")
@click.option("--output", type=click.Path(path_type=Path), required=True, help="folder to write train/ and val/ into")
@click.option("--train-images", default=64, show_default=True)
@click.option("--val-images", default=16, show_default=True)
@click.option("--image-size", default=128, show_default=True, help="largest side, pixels")
@click.option("--classes", default=3, show_default=True, help="number of shape classes (1-5)")
@click.option("--max-objects", default=4, show_default=True)
@click.option("--seed", default=0, show_default=True)
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


@main.command()
@click.option(
    "--metrics",
    "metrics_file",
    type=click.Path(path_type=Path),
    required=True,
    help="OUTPUT_DIR/metrics.jsonl of a run",
)
@click.option(
    "--out",
    "out_png",
    type=click.Path(path_type=Path),
    default=None,
    help="PNG to write (default: next to the metrics file)",
)
def report(metrics_file: Path, out_png: Path | None) -> None:
    """Draw loss and AP curves of a run into a PNG."""
    from .report import draw_report

    path = _run(draw_report, metrics_file, out_png or metrics_file.with_name("report.png"))
    click.echo(str(path))


@main.command()
@click.option("--release", required=True, help="Helm release name (the pods' app.kubernetes.io/instance label)")
@click.option(
    "-n",
    "--namespace",
    default=None,
    help="namespace (default: the kubeconfig context's; in a pod, its own; else default)",
)
@click.option(
    "--kubeconfig",
    type=click.Path(path_type=Path),
    default=None,
    help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, else the in-cluster service account)",
)
@click.option("--json", "as_json", is_flag=True, help="print JSON instead of a table")
def status(release: str, namespace: str | None, kubeconfig: Path | None, as_json: bool) -> None:
    """Pods of a deployed release (role, rank, phase, restarts, node) and the master's latest progress."""
    from .status import connect, release_status, render_status

    connection = _run(connect, kubeconfig)
    try:
        result = _run(lambda: release_status(release, namespace or connection.namespace, api=connection.api))
    finally:
        connection.close()
    click.echo(render_status(result, as_json=as_json))


def demo_flags(output_dir: Path, steps: int, engine: str) -> dict[str, Any]:
    """The embedded default job: a synthetic COCO set, the small model at 128 px, CPU, a short schedule."""
    return {
        "engine": engine,
        "model": "maskrcnn_resnet18_fpn",
        "min-size": 128,
        "max-size": 128,
        "synthetic-images": 64,
        "synthetic-image-size": 128,
        "batch-size": 4,
        "workers": 1,
        "lr": 0.02,
        "clip-grad-norm": 10.0,
        "warmup-iters": 50,
        "max-steps": steps,
        "epochs": 100,
        "lr-steps": "1000",
        "eval-every-epoch": False,  # COCO AP once, at the end; validation loss at every epoch end
        "output-dir": output_dir,
        "device": "cpu",
        "print-freq": 10,
        # pipeline: three processes share this machine's cores
        **({"threads": 1, "micro-batches": 2, "rpc-timeout": 60} if engine == "pipeline" else {}),
    }


@main.command()
@click.option("--output-dir", type=click.Path(path_type=Path), default=Path("runs/demo"), show_default=True)
@click.option("--steps", default=120, show_default=True, help="optimizer steps")
@click.option(
    "--engine",
    type=click.Choice(["pipeline", "local"]),
    default="pipeline",
    show_default=True,
    help="pipeline: master, worker 1 and worker 2 as three launcher processes on loopback",
)
def demo(output_dir: Path, steps: int, engine: str) -> None:
    """The embedded default: synthetic COCO, small Mask R-CNN, CPU, short schedule, evaluation, report.

    With the pipeline engine this is the three-machine job on one machine: `maskrcnn-launch local`
    starts the master and both stage workers with explicit identities on 127.0.0.1.
    """
    from .report import draw_report
    from .train import train as run_train

    flags = demo_flags(output_dir, steps, engine)
    if engine == "pipeline":
        import subprocess

        argv = [sys.executable, "-m", "maskrcnn_launcher", "local", "--master-port", str(_free_port()), "--"]
        for flag, value in flags.items():
            if flag != "engine":
                argv += (
                    [f"--{flag}", str(value)] if not isinstance(value, bool) else [f"--{'' if value else 'no-'}{flag}"]
                )
        code = subprocess.call(argv)
        if code:
            sys.exit(code)
    else:
        _run(run_train, _run(config_mod.build_config, None, flags))
    png = _run(draw_report, output_dir / "metrics.jsonl", output_dir / "report.png")
    click.echo(f"report: {png}")


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


if __name__ == "__main__":
    main()
