"""The split flags (--train-annotations, --train-images, --val-annotations, --val-images), the val split
--val-fraction carves, and each wrong combination refused with one line, nothing written."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from maskrcnn_dist.checkpoint import load_checkpoint
from maskrcnn_dist.config import build_config, config_to_dict, to_argv
from maskrcnn_dist.data import load_datasets
from maskrcnn_dist.data.annotations import json_read, read
from maskrcnn_dist.data.prepare import check_split, flagged_sources, run_sources
from maskrcnn_dist.data.sources import DataSources, SplitSource
from maskrcnn_dist.data.sources.resolve import carve_val, resolve_sources
from maskrcnn_dist.errors import ConfigError
from maskrcnn_dist.modeling.trained import saved_data_flags, train_command_config
from maskrcnn_dist.train import train

from .exports import cvat_project, cvat_task, write_split
from .test_exports import one_step


def test_split_flags_in_a_config_file_train_with_the_real_classes(tmp_path: Path) -> None:
    cvat_project(tmp_path / "export")
    ann, img = tmp_path / "export" / "annotations", tmp_path / "export" / "images"
    yaml = tmp_path / "run.yaml"
    yaml.write_text(
        f"train-annotations: {ann / 'instances_Train.json'}\ntrain_images: {img / 'Train'}\n"
        f"val-annotations: {ann / 'instances_Validation.json'}\nval-images: {img / 'Validation'}\n"
    )
    cfg = build_config(yaml, {})
    sources = resolve_sources(cfg.data, cfg.seed)
    assert sources.layout == "flags" and sources.splits["val"].images == img / "Validation"
    run = one_step(None, tmp_path / "run", **split_flags_of(cfg))
    train(run)
    saved = load_checkpoint(run.output_dir / "checkpoints")
    assert [name for _, name in saved["categories"][1:]] == ["person", "bike"]


def split_flags_of(cfg) -> dict[str, object]:
    data = config_to_dict(cfg)["data"]
    return {
        k.replace("_", "-"): data[k] for k in ("train_annotations", "train_images", "val_annotations", "val_images")
    }


def test_val_fraction_is_the_same_on_every_rank_and_after_a_resume(tmp_path: Path, monkeypatch, caplog) -> None:
    cats = [{"id": 1, "name": "cell"}, {"id": 2, "name": "nucleus"}]
    names = [f"{k}.jpg" for k in range(10)]
    write_split(tmp_path / "big" / "train.json", tmp_path / "big" / "images", names, cats, [1, 2])
    train_only = DataSources(
        "flags", {"train": SplitSource(tmp_path / "big" / "train.json", tmp_path / "big" / "images")}
    )
    monkeypatch.setenv("RANK", "0")
    rank0 = carve_val(train_only, 0.3, seed=7)
    monkeypatch.setenv("RANK", "1")
    rank1 = carve_val(train_only, 0.3, seed=7)
    assert rank0 == rank1 and len(rank0.splits["val"].image_ids) == 3
    assert set(rank0.splits["val"].image_ids).isdisjoint(rank0.splits["train"].image_ids)
    assert carve_val(train_only, 0.3, seed=8) != rank0  # the seed chooses
    # A run records its flags and seed: the checkpoint's config carves the same split again.
    cfg = one_step(tmp_path / "big", tmp_path / "run", **{"val-fraction": 0.3, "seed": 7})
    train(cfg)
    train_set, val_set = load_datasets(cfg)
    assert val_set.source == rank0.splits["val"]
    assert tuple(val_set.image_ids) == rank0.splits["val"].image_ids and len(train_set) == 7
    saved = load_checkpoint(cfg.output_dir / "checkpoints")["config"]
    again = build_config(None, saved_data_flags(saved))
    assert resolve_sources(again.data, again.seed).splits == rank0.splits
    # eval with the checkpoint alone evaluates on the images it validated on
    given = {"output-dir": cfg.output_dir, "test-only": True, "resume": cfg.output_dir / "checkpoints", "workers": 0}
    evaluated = train_command_config(None, given)  # what `eval` runs
    assert train(evaluated).eval["images"] == 3 and evaluated.data.val_fraction == 0.3
    # eval --seed 5 still evaluates on the run's val split: another seed would carve training images
    with caplog.at_level(logging.WARNING):
        reseeded = train_command_config(None, {**given, "seed": 5})
    assert resolve_sources(reseeded.data, reseeded.seed).splits == rank0.splits
    assert any(r.getMessage().startswith("--seed 5 given: ") for r in caplog.records)
    # with the data flags given, the seed carves anew
    flags = {**given, "data-path": tmp_path / "big", "val-fraction": 0.3, "seed": 5}
    assert resolve_sources(train_command_config(None, flags).data, 5).splits != rank0.splits


def test_a_carved_split_is_named_as_such(tmp_path: Path) -> None:
    """Both splits carved from one file: the check names each by its part, not the file alone."""
    names = [f"{k}.jpg" for k in range(10)]
    write_split(tmp_path / "big" / "train.json", tmp_path / "big" / "images", names, [{"id": 1, "name": "c"}], [1])
    cfg = one_step(tmp_path / "big", tmp_path / "run", **{"val-fraction": 0.3})
    _, reports = check_split(cfg, ["train", "val"])
    assert [r.source for r in reports] == [
        f"{tmp_path / 'big' / 'train.json'} (train split carved by --val-fraction: 7 images)",
        f"{tmp_path / 'big' / 'train.json'} (val split carved by --val-fraction: 3 images)",
    ]


def test_a_restart_carves_from_the_cache_and_parses_nothing(tmp_path: Path, monkeypatch) -> None:
    """The carve needs the train file's image ids: a restart takes them from the store its first start
    cached, as the splits' opening does; the file is read only where no valid cache is there."""
    names = [f"{k}.jpg" for k in range(10)]
    write_split(tmp_path / "big" / "train.json", tmp_path / "big" / "images", names, [{"id": 1, "name": "c"}], [1])
    cfg = one_step(tmp_path / "big", tmp_path / "run", **{"val-fraction": 0.3})
    first = flagged_sources(cfg).sources  # no cache yet: the file's images are read
    load_datasets(cfg, first)  # the first start caches the store
    parsed: list[Path] = []
    monkeypatch.setattr(json_read, "read_annotation_file", lambda path: parsed.append(path))
    monkeypatch.setattr(read, "read_store", lambda path, kept=None: parsed.append(path))
    flagged = flagged_sources(cfg)
    assert flagged.sources == first and run_sources(cfg, flagged.cache) == first and not parsed
    train_set, val_set = load_datasets(cfg)
    assert (len(train_set), len(val_set)) == (7, 3) and not parsed
    off = one_step(tmp_path / "big", tmp_path / "run", **{"val-fraction": 0.3, "data-cache": "off"})
    with pytest.raises(TypeError):  # no cache to read from: the file is read (here, refused by the stand-in)
        flagged_sources(off)
    assert parsed == [tmp_path / "big" / "train.json"]


def _argv(*words: str) -> list[str]:
    return [*to_argv({"model": "maskrcnn_resnet18_fpn", "device": "cpu", "max-steps": 1}), *words]


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (
            ["--train-annotations", "{root}/annotations", "--train-images", "{root}/images"],
            ["--train-annotations", "is a folder"],
        ),
        (
            ["--train-annotations", "{ann}", "--train-images", "{root}/nowhere"],
            ["--train-images", "nowhere: no such folder"],
        ),
        (
            ["--train-annotations", "{ann}", "--train-images", "{ann}"],
            ["--train-images", "instances_default.json is a file", "the folder"],
        ),
        (["--data-path", "{ann}"], ["--data-path", "instances_default.json is a file", "--train-annotations"]),
        (["--data-path", "{root}", "--val-fraction", "0"], ["--val-fraction must be > 0"]),
        (["--data-path", "{root}", "--val-fraction", "1"], ["--val-fraction must be < 1"]),
        (
            ["--data-path", "{root}", "--val-fraction", "0.1"],
            ["--val-fraction 0.1 of the 3 images", "leaves an empty split"],
        ),
        (
            ["--data-path", "{root}", "--train-annotations", "{other}", "--train-images", "{root}/images"],
            ["--data-path", "say otherwise"],
        ),
        (["--data-path", "{root}", "--val-annotations", "{ann}"], ["--val-annotations needs --val-images"]),
    ],
    ids=[
        "annotations-folder",
        "images-missing",
        "images-a-file",
        "data-path-a-file",
        "fraction-0",
        "fraction-1",
        "fraction-empty",
        "mixed",
        "val-no-images",
    ],
)
def test_wrong_data_flags_are_one_line_exit_2_nothing_written(console, tmp_path: Path, args, fragments) -> None:
    root = tmp_path / "cvat"
    cvat_task(root)
    other = tmp_path / "other.json"
    other.write_text((root / "annotations" / "instances_default.json").read_text())
    values = {"root": root, "ann": root / "annotations" / "instances_default.json", "other": other}
    filled = [a.format(**values) for a in args]
    result = console("maskrcnn-dist", "train", *_argv(*filled), "--output-dir", str(tmp_path / "run"))
    result.assert_one_error_line(2, *[f.format(**values) for f in fragments])
    assert not (tmp_path / "run").exists()


def test_check_data_shows_what_it_found(console, tmp_path: Path) -> None:
    cvat_task(tmp_path / "cvat")
    ann = tmp_path / "cvat" / "annotations" / "instances_default.json"
    result = console(
        "maskrcnn-dist",
        "check-data",
        "--train-annotations",
        str(ann),
        "--train-images",
        str(tmp_path / "cvat" / "images"),
    )
    assert result.code == 0, result.stderr
    assert "dataset: flags" in result.stdout and "train: " in result.stdout and "3 images" in result.stdout
    assert "'car' (id 1): 2 instances" in result.stdout and "'road' (id 2): 0 instances, 1 crowd" in result.stdout


def test_split_flags_with_a_generated_set_are_refused() -> None:
    with pytest.raises(ConfigError, match="--synthetic-images generates the data"):
        build_config(None, {"synthetic-images": 4, "train-annotations": "a.json", "train-images": "images"})
