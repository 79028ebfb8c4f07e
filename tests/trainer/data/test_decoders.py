"""The seam for a new annotation format (data/annotations/read.py): a Decoder in DECODERS reads its own
format into the columns the rules judge, declines any other file, and a run reads that format through the
front door like COCO, its store cached like COCO's; COCO files read as before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from maskrcnn_dist.data import load_datasets
from maskrcnn_dist.data.annotations import read
from maskrcnn_dist.data.annotations.json_read import judged_columns
from maskrcnn_dist.data.annotations.read import DECODERS, Declined, Decoder
from maskrcnn_dist.errors import DatasetError

from ..conftest import fast_config
from .exports import write_split

TOY_HEADER = "# toy boxes 1"


def read_toy(path: Path, where: str, kept: list[object] | None = None):
    """A made-up format, a line per record: `image ID FILE W H`, `category ID NAME`, `box ID IMAGE
    CATEGORY X Y W H` (a box is its own mask). Written as COCO's records, judged by the same rules."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise Declined("not text") from e
    if not lines or lines[0] != TOY_HEADER:
        raise Declined("no toy header")
    data: dict[str, list[Any]] = {"images": [], "annotations": [], "categories": []}
    for line in lines[1:]:
        kind, *fields = line.split()
        if kind == "image":
            iid, name, w, h = fields
            data["images"].append({"id": int(iid), "file_name": name, "width": int(w), "height": int(h)})
        elif kind == "category":
            data["categories"].append({"id": int(fields[0]), "name": fields[1]})
        else:
            aid, iid, cid, x, y, w, h = (float(v) for v in fields)
            polygon = [x, y, x + w, y, x + w, y + h, x, y + h]
            record = {"id": int(aid), "image_id": int(iid), "category_id": int(cid), "bbox": [x, y, w, h]}
            data["annotations"].append({**record, "segmentation": [polygon], "area": w * h, "iscrowd": 0})
    return judged_columns(data, where)


TOY = Decoder("toy boxes", read_toy)
WITH_TOY = (DECODERS[0], TOY, *DECODERS[1:])  # before COCO's json decoder, which takes any JSON file


def as_toy(coco_file: Path, toy_file: Path) -> None:
    """The records of a COCO file of boxes-as-polygons (exports.write_split's), in the toy format."""
    data = json.loads(coco_file.read_text())
    lines = [TOY_HEADER]
    lines += [f"image {i['id']} {i['file_name']} {i['width']} {i['height']}" for i in data["images"]]
    lines += [f"category {c['id']} {c['name']}" for c in data["categories"]]
    lines += [
        f"box {a['id']} {a['image_id']} {a['category_id']} {' '.join(map(str, a['bbox']))}" for a in data["annotations"]
    ]
    toy_file.write_text("\n".join(lines) + "\n")


@pytest.fixture
def split(tmp_path: Path) -> tuple[Path, Path, Path]:
    """One split as COCO JSON and as the toy format, its images beside."""
    coco, images = tmp_path / "train.json", tmp_path / "images"
    write_split(coco, images, [f"{k}.jpg" for k in range(3)], [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}], [1, 2])
    toy = tmp_path / "train.toy"
    as_toy(coco, toy)
    return coco, toy, images


def test_a_decoder_in_the_seam_reads_its_format_as_coco_reads_the_same_records(split, monkeypatch) -> None:
    coco, toy, _ = split
    monkeypatch.setattr(read, "DECODERS", WITH_TOY)
    from_toy, from_coco = read.read_store(toy), read.read_store(coco)
    assert from_toy.arrays.keys() == from_coco.arrays.keys()
    for name, array in from_coco.arrays.items():
        np.testing.assert_array_equal(from_toy.arrays[name], array, err_msg=name)
    assert from_toy.categories == from_coco.categories


def test_a_run_reads_the_new_format_through_the_front_door(split, tmp_path: Path, monkeypatch) -> None:
    coco, toy, images = split
    monkeypatch.setattr(read, "DECODERS", WITH_TOY)
    built = {}
    for name, file in (("toy", toy), ("coco", coco)):
        cfg = fast_config(None, tmp_path / name, **{"train-annotations": file, "train-images": images})
        built[name], _ = load_datasets(cfg)
        assert list((tmp_path / name / "cache").glob("train-*.samples"))  # cached alike
    assert len(built["toy"]) == 3 and built["toy"].category_names == ["__background__", "a", "b"]
    for k in range(3):
        (toy_image, toy_target), (image, target) = built["toy"][k], built["coco"][k]
        assert toy_image.equal(image)
        assert toy_target.keys() == target.keys()
        for key, value in target.items():
            assert value.equal(toy_target[key]) if hasattr(value, "equal") else value == toy_target[key], key


def test_coco_files_read_as_before_and_a_format_nobody_reads_is_named(split, tmp_path: Path, monkeypatch) -> None:
    coco, toy, _ = split
    monkeypatch.setattr(read, "DECODERS", WITH_TOY)
    data = json.loads(coco.read_text())
    for ann in data["annotations"]:
        del ann["area"]  # msgspec's read gives up here: the toy decoder declines, json reads it
    no_area = tmp_path / "no_area.json"
    no_area.write_text(json.dumps(data))
    assert len(read.read_store(no_area)) == 3
    monkeypatch.setattr(read, "DECODERS", (*DECODERS[:1], TOY))  # no catch-all: a file none takes is named
    with pytest.raises(DatasetError, match=r"no_area.json: not an annotation file this program reads"):
        read.read_store(no_area)
    with pytest.raises(DatasetError, match="not valid JSON"):  # COCO's json decoder decides its errors
        read.decode(toy, str(toy), decoders=DECODERS)
