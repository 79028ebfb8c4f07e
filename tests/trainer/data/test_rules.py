"""The annotation rules (data/annotations/rules.py), one vectorised statement each, refuse exactly what the
record-by-record rules refused, at the same record, in the same words (reference_rules.py keeps those):
every single fault a field can have, and pairs of faults in one record or in two, on a file of every
kind of annotation. The msgspec read refuses them too (json words them), and a file both take gives one
store."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from maskrcnn_dist.data.annotations import fast_read, json_read, read
from maskrcnn_dist.errors import DatasetError

from .reference_rules import first_refusal
from .test_fast_read import assert_same_store
from .test_store import write_mixed_set

# field -> values it must be refused (or, where the old rules took them, accepted) with
IMAGE_FAULTS: dict[str, list[Any]] = {
    "id": ["7", None, 1.5, True, "dup"],
    "file_name": ["", None, 3],
    "width": [0, -1, "23", 23.0, None, True, 2**40],
    "height": [0, -4, None, False],
}
ANNOTATION_FAULTS: dict[str, list[Any]] = {
    "id": [None, "5", 2.0, "dup"],
    "image_id": [99, "3", None, 3.0, "missing"],
    "category_id": [42, "2", None, True, "missing"],
    "bbox": [[0, 1, 2], [1, "a", 2, 3], [1, 2, 3, None], "x", [float("inf"), 1, 2, 3], [True, 1, 2, 3], "missing"],
    "segmentation": [
        [],
        [[1, 2, 3, 4]],
        [[1, 2, 3, 4, 5]],
        [[1, 1, 5, 1, 5, 4], [1, 1, None, 1, 5, 4]],
        [[1, 1, "x", 1, 5, 4]],
        [[1, 1, "5", 1, 5, 4]],
        [[1, 1, 5, 1, 5, 4], [-90, 0, 1, 0, 1, 1]],
        [[0, 0, 1e12, 0, 1e12, 1e12]],
        [[[1, 2], [3, 4], [5, 6]]],
        [[1, 1, True, 1, 5, 4]],
        ["abc"],
        {"size": [18, 23], "counts": [391]},
        {"size": [17.0, 23.0], "counts": [391]},
        {"size": [17, 23], "counts": [390]},
        {"size": [17, 23], "counts": [400, -9]},
        {"size": [17, 23], "counts": [True, 390]},
        {"size": [17, 23], "counts": []},
        {"size": [17, 23], "counts": "!!garbage"},
        {"size": [17, 23], "counts": "0"},
        {"size": [17, 23], "counts": ""},
        {"size": [17, 23], "counts": 391},
        {"counts": [391]},
        "polygon",
        None,
        "missing",
    ],
    "iscrowd": [2, "1", True, 1.0, None],
    "area": [-1, "3", None, float("nan"), True, "missing"],
}
BAD_ANNOTATION_RECORDS = ["not a dict", None, [1, 2]]


def _faults() -> list[tuple[str, str, Any]]:
    return [("images", field, value) for field, values in IMAGE_FAULTS.items() for value in values] + [
        ("annotations", field, value) for field, values in ANNOTATION_FAULTS.items() for value in values
    ]


def _spoil(data: dict[str, Any], part: str, index: int, field: str, value: Any) -> None:
    records = data[part]
    record = records[index]
    if value == "missing":
        del record[field]
    elif value == "dup":
        record[field] = records[index - 1][field]
    else:
        record[field] = copy.deepcopy(value)


def _base(tmp_path: Path) -> dict[str, Any]:
    _, ann_file = write_mixed_set(tmp_path / "base")
    return json.loads(ann_file.read_text())


def _outcome_of_the_reads(tmp_path: Path, data: dict[str, Any]) -> tuple[str | None, str | None]:
    """(json's refusal or None, the reference's refusal or None) for `data`; where both accept, the
    msgspec read, if it takes the file, gives json's store."""
    path = tmp_path / "spoiled.json"
    path.write_text(json.dumps(data))
    where = str(path)
    try:
        store = read.read_store(path)
        ours = None
    except DatasetError as e:
        ours, store = str(e), None
    except Exception as e:  # noqa: BLE001 - as it was raised
        ours, store = f"{type(e).__name__}: {e}", None
    reference = first_refusal(copy.deepcopy(json.loads(path.read_text())), where)
    if ours is not None:
        with pytest.raises(Exception):  # noqa: B017 - the msgspec read refuses it too (json words it)
            fast_read.read_columns(path, where)
    elif store is not None:
        try:
            taken = fast_read.read_columns(path, where)
        except Exception:  # noqa: BLE001 - not a plain file: json read it
            taken = None
        if taken is not None:
            from maskrcnn_dist.data.annotations.store import SampleStore

            json_store = SampleStore.of_columns(*json_read.read_columns(path, where), where)
            assert_same_store(SampleStore.of_columns(*taken, where), json_store)
    return ours, reference


@pytest.mark.parametrize(("part", "field", "value"), _faults(), ids=lambda v: repr(v)[:24])
def test_each_fault_is_refused_as_the_record_rules_refused_it(
    tmp_path: Path, part: str, field: str, value: Any
) -> None:
    data = _base(tmp_path)
    _spoil(data, part, 4 if part == "images" else 30, field, value)
    ours, reference = _outcome_of_the_reads(tmp_path, data)
    assert ours == reference


@pytest.mark.parametrize("record", BAD_ANNOTATION_RECORDS)
def test_a_record_that_is_no_object_is_named_by_its_index(tmp_path: Path, record: Any) -> None:
    data = _base(tmp_path)
    data["annotations"][12] = record
    ours, reference = _outcome_of_the_reads(tmp_path, data)
    assert ours == reference and ours is not None and "annotations[12]" in ours


def test_pairs_of_faults_are_refused_at_the_first_record_and_rule(tmp_path: Path) -> None:
    """Two faults, in one record or in two (either order, either part): the first record, its first rule."""
    rng = random.Random(44)
    faults = _faults()
    base = _base(tmp_path)
    seen = set()
    for case in range(400):
        data = copy.deepcopy(base)
        first, second = rng.sample(faults, 2)
        same_record = case % 3 == 0 and first[0] == second[0] == "annotations" and first[1] != second[1]
        index = rng.randrange(1, len(data["annotations"]) - 1)
        for k, (part, field, value) in enumerate((first, second)):
            where = index if same_record or part == "annotations" and k == 0 else None
            if part == "images":
                where = rng.randrange(1, len(data["images"]))
            elif where is None:
                where = rng.randrange(1, len(data["annotations"]))
            if value == "missing" and field not in data[part][where]:
                continue
            _spoil(data, part, where, field, value)
        ours, reference = _outcome_of_the_reads(tmp_path, data)
        assert ours == reference, (first, second)
        seen.add(ours is None)
    assert seen == {False, True} or seen == {False}  # refusals, and maybe a pair both rules take


def test_a_far_point_and_a_non_number_in_the_store_are_named_in_the_stores_order(tmp_path: Path) -> None:
    data = _base(tmp_path)
    images_by_id = sorted(data["images"], key=lambda img: img["id"])
    late, early = images_by_id[-1]["id"], images_by_id[0]["id"]
    anns = [a for a in data["annotations"] if isinstance(a["segmentation"], list) and "area" in a]
    late_ann = next(a for a in anns if a["image_id"] == late)
    early_ann = next(a for a in anns if a["image_id"] == early)
    late_ann["segmentation"] = [[1, 1, "x", 1, 5, 4]]  # first in the file, last in the store
    early_ann["segmentation"] = [[1, 1, 5, 1, 5, 1e9]]
    ours, reference = _outcome_of_the_reads(tmp_path, data)
    assert ours == reference and f"annotation id {early_ann['id']} " in (ours or "")


def test_the_clipping_that_drops_a_box_is_the_targets(tmp_path: Path) -> None:
    """A box empty after clipping is dropped by the rule both reads run; the targets clip by the same."""
    from maskrcnn_dist.data.annotations.rules import clip_boxes

    from .reference_rules import clipped_xyxy

    rng = np.random.default_rng(0)
    boxes = rng.uniform(-40, 60, size=(500, 4)).round(rng.integers(0, 3))
    widths, heights = rng.integers(1, 50, 500), rng.integers(1, 50, 500)
    ours = clip_boxes(boxes, widths, heights)
    theirs = np.array([clipped_xyxy(b.tolist(), int(w), int(h)) for b, w, h in zip(boxes, widths, heights)])
    assert np.array_equal(ours, theirs)
