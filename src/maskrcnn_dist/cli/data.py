"""The data commands: synth-data (a synthetic COCO set) and check-data (what a dataset holds, every image
checked as training checks it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from .. import config as config_mod
from .options import collect, field_options


@click.command("synth-data")
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
    from ..data import write_train_val
    from ..errors import ConfigError
    from ..run_dir import output_folder_problem

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


@click.command("check-data")
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
    from ..data import check_split, raise_if_bad

    cfg = config_mod.build_config(None, collect(kwargs))
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
