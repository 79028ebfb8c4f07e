"""Datasets as annotation tools export them: --data-path finds their splits and image folders, each
trains one step, and the checkpoint's categories are the export's real classes (placeholders left out)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from maskrcnn_dist.checkpoint import load_checkpoint
from maskrcnn_dist.data import load_datasets
from maskrcnn_dist.data.sources.detect import detect, split_of
from maskrcnn_dist.data.sources.file_names import resolve_image
from maskrcnn_dist.errors import DatasetError
from maskrcnn_dist.train import train

from ..conftest import fast_config
from .exports import EXPORTS, LABEL_STUDIO_UP, Export, cvat_task, roboflow, team_own, write_split


def one_step(data_path: Path, out: Path, **flags: object):
    return fast_config(data_path, out, **{"max-steps": 1, "min-size": 64, "max-size": 64, **flags})


@pytest.mark.parametrize("export", EXPORTS, ids=lambda e: e.name)
def test_each_export_trains_with_its_real_classes(export: Export, tmp_path: Path) -> None:
    root = tmp_path / export.name
    export.write(root)
    sources = detect(root)
    assert ("val" in sources.splits) == export.has_val, sources
    cfg = one_step(root, tmp_path / "run")
    train(cfg)
    saved = load_checkpoint(cfg.output_dir / "checkpoints")
    assert [name for _, name in saved["categories"][1:]] == list(export.classes)


def test_split_names_and_aliases() -> None:
    assert split_of(Path("valid/_annotations.coco.json")) == "val"
    assert split_of(Path("annotations/instances_Validation.json")) == "val"
    assert split_of(Path("annotations/instances_train2017.json")) == "train"
    assert split_of(Path("annotations/instances_default.json")) is None
    assert split_of(Path("Train/labels.json")) == "train"


def test_file_name_rule_drops_tool_prefixes(tmp_path: Path) -> None:
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "x.jpg").write_bytes(b"")
    for name in ("x.jpg", "images/x.jpg", LABEL_STUDIO_UP * 2 + "data/upload/3/x.jpg", "JPEGImages\\x.jpg"):
        assert resolve_image(tmp_path / "images", name) == (tmp_path / "images" / "x.jpg", True), name
    assert resolve_image(tmp_path / "images", "sub/y.jpg") == (tmp_path / "images" / "sub/y.jpg", False)


def test_placeholder_categories_are_left_out_with_one_warning(tmp_path: Path, caplog) -> None:
    roboflow(tmp_path / "rf")
    with caplog.at_level(logging.WARNING):
        train_set, val_set = load_datasets(one_step(tmp_path / "rf", tmp_path / "run"))
    assert train_set.category_names == val_set.category_names == ["__background__", "circle", "square"]
    assert train_set.label_to_category_id == [-1, 1, 2]
    warned = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert len(warned) == 1 and "'shapes' (id 0)" in warned[0]


def test_an_empty_real_category_is_kept_and_warned(tmp_path: Path, caplog) -> None:
    cats = [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}, {"id": 3, "name": "never"}]
    write_split(tmp_path / "train.json", tmp_path / "images", ["1.jpg", "2.jpg"], cats, [1, 2])
    with caplog.at_level(logging.WARNING):
        train_set, _ = load_datasets(one_step(tmp_path, tmp_path / "run"))
    assert train_set.category_names[1:] == ["a", "b", "never"]
    assert any("'never' (id 3)" in r.getMessage() and "no annotation" in r.getMessage() for r in caplog.records)


def test_brush_only_class_is_named_and_trained_with_the_switch(tmp_path: Path, caplog) -> None:
    cvat_task(tmp_path / "cvat")
    with caplog.at_level(logging.WARNING):
        plain, _ = load_datasets(one_step(tmp_path / "cvat", tmp_path / "run"))
    warned = [r.getMessage() for r in caplog.records if "crowd" in r.getMessage()]
    assert len(warned) == 1 and "'road' (id 2)" in warned[0] and "1 of them" in warned[0]
    assert "--crowd-as-instances" in warned[0]
    assert sum(len(plain[i][1]["labels"]) for i in range(len(plain))) == 2  # the brush mask is no target
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        crowd, _ = load_datasets(one_step(tmp_path / "cvat", tmp_path / "run", **{"crowd-as-instances": True}))
    labels = [int(label) for i in range(len(crowd)) for label in crowd[i][1]["labels"]]
    assert sorted(labels) == [1, 1, 2] and not [r for r in caplog.records if "crowd" in r.getMessage()]


def test_two_files_for_one_split_are_refused_naming_both(tmp_path: Path) -> None:
    team_own(tmp_path)
    cats = [{"id": 1, "name": "cell"}, {"id": 2, "name": "nucleus"}]
    write_split(tmp_path / "train" / "annotations.json", tmp_path / "train" / "images", ["q.jpg"], cats, [1])
    with pytest.raises(DatasetError) as info:
        detect(tmp_path)
    message = str(info.value)
    assert "train.json" in message and "annotations.json" in message and "--train-annotations" in message


@pytest.mark.parametrize(
    ("files", "hint"),
    [
        ({"a.json": '{"shapes": [], "imagePath": "a.jpg"}', "a.jpg": ""}, "labelme2coco"),
        ({"data.yaml": "names: [x]", "labels/a.txt": "0 0.5 0.5 0.1 0.1"}, "YOLO"),
        ({"Annotations/a.xml": "<annotation/>"}, "Pascal VOC"),
        ({"a.jpg": ""}, "holds no JSON file"),
    ],
)
def test_the_refusal_names_the_closest_layout_and_the_flags(tmp_path: Path, files: dict, hint: str) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    with pytest.raises(DatasetError) as info:
        detect(tmp_path)
    assert hint in str(info.value) and "--train-annotations FILE --train-images DIR" in str(info.value)


def test_a_split_folder_linked_in_from_elsewhere_is_found(tmp_path: Path) -> None:
    # A val split beside a train split linked in from another folder (how benchmarks/gpu_check.py, and
    # users sharing one train set, lay data out): the link is followed.
    cats = [{"id": 1, "name": "cell"}]
    write_split(tmp_path / "shared" / "annotations.json", tmp_path / "shared" / "images", ["t1.jpg"], cats, [1])
    root = tmp_path / "data"
    root.mkdir()
    (root / "train").symlink_to(tmp_path / "shared")
    write_split(root / "val" / "annotations.json", root / "val" / "images", ["v1.jpg"], cats, [1], first_id=9)
    sources = detect(root)
    assert sources.splits["train"].annotations == root / "train" / "annotations.json", sources
    assert sources.splits["val"].annotations == root / "val" / "annotations.json", sources


def test_a_split_takes_the_image_folder_nearest_its_file(tmp_path: Path) -> None:
    # A copy of the photos elsewhere under --data-path (a backup, another version) must not win a tie.
    cats = [{"id": 1, "name": "cell"}]
    write_split(
        tmp_path / "a_backup" / "train" / "images" / "x.json",
        tmp_path / "a_backup" / "train" / "images",
        ["t1.jpg"],
        cats,
        [1],
    )
    (tmp_path / "a_backup" / "train" / "images" / "x.json").unlink()
    write_split(
        tmp_path / "set" / "train" / "annotations.json", tmp_path / "set" / "train" / "images", ["t1.jpg"], cats, [1]
    )
    sources = detect(tmp_path)
    assert sources.splits["train"].images == tmp_path / "set" / "train" / "images", sources


@pytest.mark.parametrize("split", ["train", "val"])
def test_a_damaged_annotation_file_is_named_not_taken_for_no_split(tmp_path: Path, split: str) -> None:
    cats = [{"id": 1, "name": "cell"}]
    for name in ("train", "val"):
        write_split(tmp_path / name / "annotations.json", tmp_path / name / "images", [f"{name}.jpg"], cats, [1])
    damaged = tmp_path / split / "annotations.json"
    damaged.write_text('{"images": [')
    with pytest.raises(DatasetError, match=f"{damaged}: not valid JSON"):
        detect(tmp_path)
