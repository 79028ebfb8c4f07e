"""The annotation file's checks (data/annotations/json_read.py), through CocoInstanceDataset as training meets
them: every bad file, image, category or annotation is a DatasetError naming the file and the id;
degenerate boxes are dropped and counted; a missing area is the mask's."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from maskrcnn_dist.data import CocoInstanceDataset
from maskrcnn_dist.errors import DatasetError, UserError

from .conftest import H, W, annotation_record, dataset_error, image_record, write_set


def test_dataset_error_is_a_user_error() -> None:
    assert issubclass(DatasetError, UserError)


def test_malformed_json_names_the_file(tmp_path: Path) -> None:
    ann_file = tmp_path / "broken.json"
    ann_file.write_text('{"images": [')
    with pytest.raises(DatasetError, match="not valid JSON") as info:
        CocoInstanceDataset(tmp_path, ann_file)
    assert str(ann_file) in str(info.value)


def test_missing_annotation_file(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="not found") as info:
        CocoInstanceDataset(tmp_path, tmp_path / "nope.json")
    assert "nope.json" in str(info.value)


@pytest.mark.parametrize("key", ["images", "annotations", "categories"])
def test_missing_top_level_key(tmp_path: Path, key: str) -> None:
    ann_file = tmp_path / "instances.json"
    data = {"images": [], "annotations": [], "categories": [{"id": 1, "name": "a"}]}
    del data[key]
    ann_file.write_text(json.dumps(data))
    with pytest.raises(DatasetError) as info:
        CocoInstanceDataset(tmp_path, ann_file)
    assert str(ann_file) in str(info.value) and repr(key) in str(info.value)


def test_annotation_missing_key_names_the_annotation(tmp_path: Path) -> None:
    ann = annotation_record(7)
    del ann["segmentation"]
    message = dataset_error(tmp_path, [ann])
    assert "annotation id 7" in message and "'segmentation'" in message


def test_unknown_image_id(tmp_path: Path) -> None:
    message = dataset_error(tmp_path, [annotation_record(7, image_id=99)])
    assert "annotation id 7" in message and "unknown image id 99" in message


def test_unknown_category_id(tmp_path: Path) -> None:
    message = dataset_error(tmp_path, [annotation_record(7, category_id=42)])
    assert "annotation id 7" in message and "image id 1" in message and "unknown category id 42" in message


@pytest.mark.parametrize("polygon", [[1, 1, 5, 1], [1, 1, 5, 1, 5], [1, 1, None, 1, 5, 4]])
def test_polygon_with_fewer_than_three_points(tmp_path: Path, polygon: list[int]) -> None:
    message = dataset_error(tmp_path, [annotation_record(7, segmentation=[[1, 1, 5, 1, 5, 4], polygon])])
    assert "annotation id 7" in message and "image id 1" in message and "polygon 1" in message


def test_rle_size_must_match_the_image(tmp_path: Path) -> None:
    rle = {"size": [H + 1, W], "counts": [H * W + W]}
    message = dataset_error(tmp_path, [annotation_record(7, segmentation=rle)])
    assert "annotation id 7" in message and "RLE 'size'" in message


def test_uncompressed_rle_must_cover_the_image(tmp_path: Path) -> None:
    rle = {"size": [H, W], "counts": [10, 3]}
    message = dataset_error(tmp_path, [annotation_record(7, segmentation=rle)])
    assert "annotation id 7" in message and "summing to" in message


@pytest.mark.parametrize(
    ("segmentation", "expected"),
    [
        # pycocotools allocates by the coordinates in C: at 1e12 the process dies of SIGSEGV
        ([[0, 0, 1e12, 0, 1e12, 1e12]], "polygon 0 has the point (1e+12, 0), far outside the 8x6 image"),
        ([[1, 1, 5, 1, 5, 4], [-9, 0, 1, 0, 1, 1]], "polygon 1 has the point (-9, 0)"),
        ({"size": [H, W], "counts": "!!!!garbage"}, "compressed RLE 'counts' is not a valid run-length string"),
        ({"size": [H, W], "counts": "0"}, "covering height*width = 48 pixels"),  # decodes, but to 0 pixels
        ({"size": [H, W], "counts": "0o"}, "not a valid run-length string"),  # the last run cut off
    ],
)
def test_segmentations_pycocotools_cannot_rasterise(tmp_path: Path, segmentation: Any, expected: str) -> None:
    assert expected in dataset_error(tmp_path, [annotation_record(7, segmentation=segmentation)])


def test_duplicate_ids(tmp_path: Path) -> None:
    assert "duplicate annotation id" in dataset_error(tmp_path, [annotation_record(3), annotation_record(3)])
    assert "image id 1: duplicate image id" in dataset_error(
        tmp_path / "b", [], images=[image_record(1), image_record(1)]
    )


def test_bad_image_size_field(tmp_path: Path) -> None:
    image_dir, ann_file = write_set(tmp_path, [])
    data = json.loads(ann_file.read_text())
    data["images"][0]["width"] = 0
    ann_file.write_text(json.dumps(data))
    with pytest.raises(DatasetError, match="image id 1: 'width'"):
        CocoInstanceDataset(image_dir, ann_file)


def test_degenerate_boxes_are_dropped_and_counted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    anns = [
        annotation_record(1),
        annotation_record(2, bbox=[1, 1, 0, 3]),  # zero width
        annotation_record(3, bbox=[1, 1, 4, -2]),  # negative height
        annotation_record(4, bbox=[W + 1, 1, 3, 3]),  # entirely right of the image: empty after clipping
    ]
    image_dir, ann_file = write_set(tmp_path, anns)
    with caplog.at_level(logging.WARNING):
        dataset = CocoInstanceDataset(image_dir, ann_file)
    assert dataset.num_dropped_annotations == 3
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1  # once, not once per annotation
    assert "dropped 3 annotation(s)" in warnings[0] and "[2, 3, 4]" in warnings[0]
    assert dataset[0][1]["boxes"].shape == (1, 4)
    assert sorted(dataset.coco.anns) == [1]  # the evaluation ground truth agrees with the targets


def test_area_defaults_to_the_mask_area(tmp_path: Path) -> None:
    ann = annotation_record(1)
    del ann["area"], ann["iscrowd"]
    image_dir, ann_file = write_set(tmp_path, [ann])
    dataset = CocoInstanceDataset(image_dir, ann_file)
    _, target = dataset[0]
    assert target["area"].tolist() == [12.0] and target["iscrowd"].tolist() == [0]
    assert dataset.coco.anns[1]["area"] == 12.0  # COCOeval's area ranges read the same value
