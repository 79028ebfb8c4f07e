"""data/annotations/fast_read.py: a file it takes gives the store json.load gives, bit for bit (odd numbers, escaped
unicode, every segmentation kind); a file it does not take is read by json, with json's store or json's
error message."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from pycocotools import mask as mask_utils

from maskrcnn_dist.data.annotations import fast_read, json_read, read, store

from .test_store import write_mixed_set


def _json_store(ann_file: Path) -> store.SampleStore:
    """The store as read_store makes it when fast_read gives up."""
    where = str(ann_file)
    return store.SampleStore.of_columns(*json_read.read_columns(ann_file, where), where)


def assert_same_store(got: store.SampleStore, want: store.SampleStore) -> None:
    assert got.arrays.keys() == want.arrays.keys()
    for name, array in want.arrays.items():
        assert (got.arrays[name].dtype, got.arrays[name].shape) == (array.dtype, array.shape), name
        assert got.arrays[name].tobytes() == array.tobytes(), name
    assert got.categories == want.categories


# Written as text, not by json.dumps: the numbers as people and other tools write them.
ODD = """{"info": {"nested": [1, {"a": null}], "s": "\\u00e9t\\u00e9 \\ud83d\\ude00"}, "licenses": [],
 "images": [
  {"id": 2, "file_name": "caf\\u00e9/\\ud83d\\ude00.jpg", "width": 40, "height": 30, "extra": [true, false]},
  {"id": 1, "file_name": "\u00fcber.jpg", "width": 40, "height": 30, "width": 40},
  {"id": 9007199254740993, "file_name": "big id.jpg", "width": 40, "height": 30}],
 "annotations": [
  {"id": 5, "image_id": 2, "category_id": 7, "iscrowd": 0, "area": 1e2,
   "bbox": [-0.0, 1E1, 12, 3.5e0],
   "segmentation": [[-0.0, 0.1, 1e1, 2.5E+1, 30, 1.7976931348623157e-300, 12.000000000000001, 0.30000000000000004],
                    [1, 2, 3, 4, 5, 6]]},
  {"id": 3, "image_id": 1, "category_id": 7, "area": 9007199254740993, "bbox": [1, 1, 5, 5],
   "segmentation": {"size": [30, 40], "counts": [600, 600]}, "iscrowd": 1, "note": "x"},
  {"id": 4, "image_id": 2, "category_id": 3, "area": 0, "bbox": [50, 1, 5, 5],
   "segmentation": [[1, 2, 3, 4, 5, 6]]},
  {"id": 9, "image_id": 9007199254740993, "category_id": 3, "area": 2.0, "bbox": [0.5, 0.25, 1e-320, 4],
   "segmentation": [[1, 2, 3, 4, 5, 6]]},
  {"id": 6, "image_id": 1, "category_id": 3, "area": 2.0, "bbox": [1, 1, 5, 5], "id": 7,
   "segmentation": {"counts": "RLE", "size": [30, 40]}}],
 "categories": [{"id": 7, "name": "c\\u00e4t", "supercategory": "x", "big": 123456789012345678901234567890,
                 "f": 1e400}, {"id": 3, "name": "d"}]}
"""


def _odd_file(tmp_path: Path) -> Path:
    # A valid compressed RLE for the 30x40 image (the "RLE" placeholder above is not one).
    counts = mask_utils.encode(np.asfortranarray(np.eye(30, 40, dtype=np.uint8)))["counts"].decode()
    path = tmp_path / "odd.json"
    path.write_text(ODD.replace('"RLE"', json.dumps(counts)), encoding="utf-8")
    return path


def test_the_fast_read_gives_the_store_json_gives(tmp_path: Path) -> None:
    _, mixed = write_mixed_set(tmp_path / "mixed", missing_area=False)
    for ann_file in (mixed, _odd_file(tmp_path)):
        fast = store.SampleStore.of_columns(*fast_read.read_columns(ann_file, "x"))  # taken: no exception
        assert_same_store(fast, _json_store(ann_file))
    assert fast.file_names(range(3)) == ["über.jpg", "café/😀.jpg", "big id.jpg"]
    # 4: its box lies right of the image; 9: its width (a subnormal) vanishes when added to x in float64.
    assert fast.arrays["dropped"].tolist() == [4, 9]
    assert sorted(fast.arrays["ann_id"].tolist()) == [3, 5, 7]  # a repeated key: the last value counts


@pytest.mark.parametrize(
    "edit",
    [
        ('"area": 1e2,', ""),  # no area: computed from the mask
        ('"iscrowd": 0,', '"iscrowd": false,'),  # json's rule takes a bool
        ('"size": [30, 40], "counts": [600', '"size": [30.0, 40.0], "counts": [600'),  # equal as lists
        ('"nested": [1,', '"nested": [NaN,'),  # a literal json takes, in a field nobody reads
        ('[1, 2, 3, 4, 5, 6]]},\n  {"id": 3', '[1, 2, 3, 4, 5, true]]},\n  {"id": 3'),  # a bool point
    ],
)
def test_a_file_json_takes_in_ways_the_fast_read_does_not_gives_jsons_store(
    tmp_path: Path, edit: tuple[str, str]
) -> None:
    ann_file = _odd_file(tmp_path)
    text = ann_file.read_text(encoding="utf-8")
    assert edit[0] in text
    ann_file.write_text(text.replace(edit[0], edit[1], 1), encoding="utf-8")
    with pytest.raises(Exception):  # noqa: B017 - any refusal: the json path decides
        fast_read.read_columns(ann_file, "x")
    assert_same_store(read.read_store(ann_file), _json_store(ann_file))


@pytest.mark.parametrize(
    "edit",
    [
        ('"annotations": [', '"annotations": [,'),  # malformed
        ("]}\n", "]"),  # truncated
        ('{"info"', '\ufeff{"info"'),  # a byte order mark
        ('"s": "', '"s": "\udcff'),  # bad UTF-8 in a field nobody reads
        ('{"id": 4, "image_id": 2', '{"id": 3, "image_id": 2'),  # a repeated annotation id
        ('"id": 1, "file_name"', '"id": 2, "file_name"'),  # a repeated image id
        ('"id": 1, "file_name"', '"id": 1.0, "file_name"'),
        ('"file_name": "big id.jpg"', '"file_name": ""'),
        ('"width": 40, "height": 30, "extra"', '"width": 0, "height": 30, "extra"'),
        ('"width": 40, "height": 30, "extra"', '"width": 4294967296, "height": 30, "extra"'),
        ('"image_id": 1, "category_id": 7', '"image_id": 8, "category_id": 7'),
        ('"image_id": 1, "category_id": 7', '"image_id": 1, "category_id": 8'),
        ('"iscrowd": 0,', '"iscrowd": 2,'),
        ('"area": 1e2,', '"area": -1,'),
        ('"bbox": [-0.0, 1E1, 12, 3.5e0]', '"bbox": [0, 1, 2]'),
        ('"bbox": [-0.0, 1E1, 12, 3.5e0]', '"bbox": [1e400, 1, 2, 3]'),
        ('"bbox": [1, 1, 5, 5],\n   "segmentation": {"size"', '"bbox": [1, 1, 5, 5],\n   "segmentation": {"sizes"'),
        ('"counts": [600, 600]', '"counts": [600, 601]'),
        ('"size": [30, 40], "counts": [600', '"size": [40, 30], "counts": [600'),  # the runs' sum is right
        ('"counts": [600, 600]', '"counts": [9223372036854775807, 9223372036854775807, 1202]'),  # int64 sum: 1200
        ('[1, 2, 3, 4, 5, 6]]},\n  {"id": 3', '[1, 2, 3, 4, 5]]},\n  {"id": 3'),
        ('"segmentation": [[1, 2, 3, 4, 5, 6]]},\n  {"id": 9', '"segmentation": []},\n  {"id": 9'),
        ('[1, 2, 3, 4, 5, 6]]},\n  {"id": 3', '[1, 2, 3, 4, 5, 1e300]]},\n  {"id": 3'),  # a far point
        ('"categories": [{"id": 7', '"categories": [{"id": 3'),
    ],
)
def test_a_file_json_refuses_is_refused_in_jsons_words(tmp_path: Path, edit: tuple[str, str]) -> None:
    ann_file = _odd_file(tmp_path)
    text = ann_file.read_text(encoding="utf-8")
    assert edit[0] in text
    ann_file.write_bytes(text.replace(edit[0], edit[1], 1).encode("utf-8", "surrogateescape"))
    with pytest.raises(Exception) as json_error:  # noqa: B017 - whatever json's path raises, as it is
        _json_store(ann_file)
    with pytest.raises(Exception) as ours:  # noqa: B017
        read.read_store(ann_file)
    assert (type(ours.value), str(ours.value)) == (type(json_error.value), str(json_error.value))
