"""Datasets as annotation tools export them: --data-path finds their splits and image folders, each
trains one step, and the checkpoint's categories are the export's real classes (placeholders left out)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from maskrcnn_launcher.boundary import OWN_LINE_LIMIT

from maskrcnn_dist.categories import Categories
from maskrcnn_dist.checkpoint import load_checkpoint
from maskrcnn_dist.data import CocoInstanceDataset, load_datasets
from maskrcnn_dist.data.sources import SplitSource
from maskrcnn_dist.data.sources.detect import detect, split_of
from maskrcnn_dist.data.sources.file_names import resolve_image
from maskrcnn_dist.errors import DatasetError, classify
from maskrcnn_dist.train import train

from ..conftest import fast_config
from .conftest import annotation_record, dataset_error, write_set
from .exports import EXPORTS, LABEL_STUDIO_UP, Export, cvat_task, lvis_v1, roboflow, team_own, write_split


def one_step(data_path: Path, out: Path, **flags: object):
    return fast_config(data_path, out, **{"max-steps": 1, "min-size": 64, "max-size": 64, **flags})


@pytest.mark.parametrize("export", EXPORTS, ids=lambda e: e.name)
def test_each_export_opens_with_its_real_classes(export: Export, tmp_path: Path) -> None:
    """What training reads of an export, without the model: its splits found, its datasets opened as
    the trainer opens them, the labels it will save (Categories.of_dataset, what a checkpoint holds) its
    real classes, and every train image and target read and within those labels."""
    root = tmp_path / export.name
    export.write(root)
    sources = detect(root)
    assert ("val" in sources.splits) == export.has_val, sources
    train_set, val_set = load_datasets(one_step(root, tmp_path / "run"))
    assert (val_set is not None) == export.has_val
    assert Categories.of_dataset(train_set).names[1:] == export.classes
    for index in range(len(train_set)):
        image, target = train_set[index]
        assert image.shape[0] == 3 and target["masks"].shape[-2:] == image.shape[-2:], (export.name, index)
        assert all(0 < label < train_set.num_classes for label in target["labels"].tolist()), (export.name, index)


# One export of each kind trains a step end to end (the model, the data check, the checkpoint): with a
# val split and a placeholder category (Roboflow), without one and with a brush-only class (CVAT).
# Past the opening above, the trainer treats every export alike.
TRAINED_EXPORTS = [e for e in EXPORTS if e.name in ("roboflow", "cvat_task")]


@pytest.mark.slow
@pytest.mark.parametrize("export", TRAINED_EXPORTS, ids=lambda e: e.name)
def test_an_export_of_each_kind_trains_with_its_real_classes(export: Export, tmp_path: Path) -> None:
    root = tmp_path / export.name
    export.write(root)
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


def test_lvis_images_are_found_by_their_coco_url_under_any_of_its_folders(tmp_path: Path) -> None:
    """LVIS lists its images by coco_url alone: the URL's path is the file name, found under the folder
    holding train2017/ and val2017/ (val's images in both) or under train2017/ itself; an image with
    neither a file_name nor a URL is refused naming both."""
    lvis_v1(tmp_path / "lvis")
    sources = detect(tmp_path / "lvis")
    assert sources.splits["val"].images == tmp_path / "lvis"  # the folder holding both of val's folders
    _, val_set = load_datasets(one_step(tmp_path / "lvis", tmp_path / "run"))
    assert sorted(e.path.relative_to(tmp_path / "lvis").as_posix() for e in val_set.image_entries()) == [
        "train2017/30.jpg",
        "val2017/139.jpg",
    ]
    train_flags = {"train-annotations": tmp_path / "lvis/annotations/lvis_v1_train.json"}
    cfg = fast_config(None, tmp_path / "run2", **train_flags, **{"train-images": tmp_path / "lvis/train2017"})
    train_set, _ = load_datasets(cfg)
    assert all(e.path.is_file() for e in train_set.image_entries())
    data = json.loads((tmp_path / "lvis/annotations/lvis_v1_train.json").read_text())
    del data["images"][0]["coco_url"]
    (tmp_path / "lvis/annotations/lvis_v1_train.json").write_text(json.dumps(data))
    with pytest.raises(DatasetError, match=r"image id 1: missing or empty 'file_name' \(and no 'coco_url'"):
        load_datasets(cfg)


def test_a_file_reached_through_a_link_is_one_file(tmp_path: Path) -> None:
    """A V7 Darwin release as darwin-py pulls it: releases/latest links to the release pulled, so its
    COCO file is there twice; one file, one train split, taken by the path through no link."""
    root = tmp_path / "team" / "dataset"
    release = root / "releases" / "v3"
    write_split(
        release / "annotations" / "output.json", root / "images", ["a.jpg", "b.jpg"], [{"id": 1, "name": "x"}], [1]
    )
    (root / "releases" / "latest").symlink_to("v3")
    sources = detect(root)
    assert sources.splits["train"] == SplitSource(release / "annotations" / "output.json", root / "images")
    assert "val" not in sources.splits


def test_a_refusal_too_long_for_one_line_keeps_its_hint(tmp_path: Path) -> None:
    """The kit's own refusals are cut only when very long, and then from the middle: the flags that
    choose, at the end, are printed."""
    cats = [{"id": 1, "name": "x"}]
    for k in range(16):
        write_split(
            tmp_path / f"export_number_{k}_with_a_long_name" / "train.json",
            tmp_path / f"images{k}",
            ["a.jpg"],
            cats,
            [1],
        )
    with pytest.raises(DatasetError) as info:
        detect(tmp_path)
    (line,) = classify(info.value).lines
    assert len(str(info.value)) > OWN_LINE_LIMIT >= len(line)
    assert line.startswith(f"--data-path {tmp_path}: 16 files could be the train split: ")
    assert line.endswith(" ... pass --train-annotations FILE --train-images DIR to choose"), line


def test_a_class_mostly_crowd_is_named_with_its_share(tmp_path: Path, caplog) -> None:
    """supervision writes a mask with a hole or several parts as iscrowd 1 (12 of 15 of a SAM-made set):
    a class whose crowd regions are a sizeable share is named with the share and the switch; one with
    a crowd region now and then (COCO's) is not."""
    anns = [annotation_record(k, category_id=1, iscrowd=int(k <= 12)) for k in range(1, 16)]
    anns += [annotation_record(k, category_id=2, iscrowd=int(k == 16)) for k in range(16, 36)]
    image_dir, ann_file = write_set(tmp_path, anns, categories=[{"id": 1, "name": "leaf"}, {"id": 2, "name": "pot"}])
    flags = {"train-annotations": ann_file, "train-images": image_dir}
    with caplog.at_level(logging.WARNING):
        load_datasets(fast_config(None, tmp_path / "run", **flags))
    warned = [r.getMessage() for r in caplog.records if "crowd" in r.getMessage()]
    assert len(warned) == 1, warned
    assert "12 of the 15 annotations of category 'leaf' (id 1) (80%) are crowd regions" in warned[0]
    assert "supervision" in warned[0] and "--crowd-as-instances" in warned[0]


@pytest.mark.parametrize("segmentation", [[], None], ids=["empty", "absent"])
def test_a_boxes_only_export_is_refused_as_such(tmp_path: Path, segmentation: list | None) -> None:
    """An object-detection export (every 'segmentation' empty, or none at all) is refused as a file
    without masks, with what to do, in one line; one annotation without a polygon among masks is
    refused for itself."""

    def annotation(k: int) -> dict:
        record = annotation_record(k, segmentation=segmentation)
        return {key: value for key, value in record.items() if value is not None}

    message = dataset_error(tmp_path / "boxes", [annotation(k) for k in (1, 2, 3)])
    says = "'segmentation' has no polygon" if segmentation == [] else "missing key 'segmentation'"
    assert f"annotation id 1 (image id 1): {says}; none of the file's 3 annotations has a mask" in message
    assert "(a boxes-only export)" in message and "export polygons or masks" in message
    (line,) = classify(DatasetError(message)).lines
    assert line.endswith("or make masks from the boxes (e.g. SAM)"), line
    one = dataset_error(tmp_path / "one", [annotation(1), annotation_record(2), annotation_record(3)])
    assert one.endswith(f"annotation id 1 (image id 1): {says}")


def test_a_signed_url_written_as_file_name_finds_the_downloaded_file(tmp_path: Path) -> None:
    """Converters of cloud-hosted sets write each image's URL as its file_name: its path (the query of a
    signed URL no part of it) is the name the file_name rule looks for."""
    image_dir, ann_file = write_set(tmp_path, [annotation_record(1)])
    data = json.loads(ann_file.read_text())
    data["images"][0]["file_name"] = "https://bucket.s3.amazonaws.com/project/1.png?X-Amz-Signature=ab%2Fc"
    ann_file.write_text(json.dumps(data))
    for read in ("msgspec", "json"):
        if read == "json":  # an area left out: the msgspec read gives the file to json's
            del data["annotations"][0]["area"]
            ann_file.write_text(json.dumps(data))
        dataset = CocoInstanceDataset(image_dir, ann_file)  # refuses a missing file
        assert [e.path for e in dataset.image_entries()] == [image_dir / "1.png"]


def test_a_large_file_is_judged_by_both_ends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file too large to parse for detection is judged by its first and last bytes: COCO writes its
    images first, LVIS (1.1 GB for train) its annotations first and its images and categories last; a
    keypoints file (its categories last) is none."""
    from maskrcnn_dist.data.sources import detect as detection

    lvis_v1(tmp_path / "lvis")
    path = tmp_path / "lvis" / "annotations" / "lvis_v1_train.json"
    data = json.loads(path.read_text())
    many = [{**data["annotations"][0], "id": k} for k in range(1, 400)]
    ordered = {
        "info": {},
        "annotations": many,
        "images": data["images"],
        "licenses": [],
        "categories": data["categories"],
    }
    path.write_text(json.dumps(ordered))
    monkeypatch.setattr(detection, "MAX_PARSED", 1024)
    monkeypatch.setattr(detection, "PEEK", 4096)
    assert '"images"' not in path.read_text()[:4096]
    assert detection.coco_file_names(path) == ["train2017/9.jpg", "train2017/25.jpg"]
    coco_order = {"images": data["images"], "annotations": many, "categories": data["categories"]}
    path.write_text(json.dumps(coco_order))
    assert detection.coco_file_names(path) == ["train2017/9.jpg", "train2017/25.jpg"]
    keypoints = {**coco_order, "categories": [{"id": 1, "name": "person", "keypoints": ["nose"], "skeleton": []}]}
    path.write_text(json.dumps(keypoints))
    assert detection.coco_file_names(path) is None
