"""The compact store (data/annotations/store.py) and its cache (data/cache.py): targets and ground truth identical to
what the JSON itself gives, for every kind of annotation; a cache rebuilt when its file changed or is
damaged, never used then; processes starting at once agree on one cache written once."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO

from maskrcnn_dist.data import CocoInstanceDataset
from maskrcnn_dist.data.annotations import read, store
from maskrcnn_dist.data.annotations.masks import decode_masks
from maskrcnn_dist.data.cache import HEADER_SIZE
from maskrcnn_dist.data.images.check import CheckRules, check_datasets
from maskrcnn_dist.errors import DatasetError

from .photos import encode, shown_photo, stored_for
from .reference_rules import clipped_xyxy, validate_annotations, validate_categories, validate_images

W, H = 23, 17


def _polygon(rng: np.random.Generator, integers: bool) -> list[float]:
    points = rng.uniform([0, 0], [W, H], size=(int(rng.integers(3, 9)), 2))
    return [int(v) for v in points.ravel()] if integers else [float(v) for v in points.ravel()]


def _rle(rng: np.random.Generator, compressed: bool) -> dict[str, Any]:
    mask = np.asfortranarray((rng.uniform(size=(H, W)) > 0.7).astype(np.uint8))
    rle = mask_utils.encode(mask)
    if compressed:
        return {"size": [H, W], "counts": rle["counts"].decode()}
    runs, value, count = [], 0, 0
    for pixel in mask.ravel(order="F"):  # uncompressed counts: alternating runs, zeros first
        if pixel == value:
            count += 1
        else:
            runs.append(count)
            value, count = pixel, 1
    return {"size": [H, W], "counts": [*runs, count]}


def write_mixed_set(root: Path, seed: int = 0, missing_area: bool = True) -> tuple[Path, Path]:
    """Every kind of annotation the store holds: polygons (one and several, float and integer points),
    compressed and uncompressed RLE, crowd regions, a missing area (unless not `missing_area`: a file
    data/annotations/fast_read.py takes), a box clipped by the image, a degenerate box (dropped), images with no
    annotation, non-contiguous category ids, and a JPEG stored turned under EXIF orientation 6,
    annotated in the frame a viewer shows."""
    rng = np.random.default_rng(seed)
    images_dir = root / "images"
    images_dir.mkdir(parents=True)
    images, annotations = [], []
    for image_id in (3, 1, 7, 4, 9, 12):  # not in id order: the store sorts them
        images.append({"id": image_id, "file_name": f"sub/{image_id}.png", "width": W, "height": H})
        (images_dir / "sub").mkdir(exist_ok=True)
        Image.new("RGB", (W, H), (image_id, 0, 0)).save(images_dir / "sub" / f"{image_id}.png")
    shown = shown_photo((W, H))
    (images_dir / "turned.jpg").write_bytes(encode(stored_for(shown, 6), "jpeg-exif", 6))
    images.append({"id": 20, "file_name": "turned.jpg", "width": W, "height": H})
    ann_id = 100
    for image_id in (3, 1, 7, 4, 20, 3, 1):  # 9 and 12 have none; annotations of an image interleave
        for kind in ("polygon", "polygons", "int-polygon", "rle", "counts", "crowd", "crowd-rle", "no-area"):
            ann_id += 1
            segm: Any
            if kind in ("polygon", "no-area"):
                segm = [_polygon(rng, False)]
            elif kind == "polygons":
                segm = [_polygon(rng, False), _polygon(rng, False)]
            elif kind == "int-polygon":
                segm = [_polygon(rng, True)]
            else:
                segm = _rle(rng, compressed=kind in ("rle", "crowd-rle"))
            x, y = rng.uniform(-3, W - 2), rng.uniform(-3, H - 2)
            ann = {
                "id": ann_id,
                "image_id": image_id,
                "category_id": int(rng.choice([2, 5, 11])),
                "bbox": [x, y, rng.uniform(1, 30), rng.uniform(1, 30)],
                "segmentation": segm,
                "area": float(rng.uniform(1, 99)),
                "iscrowd": int(kind.startswith("crowd")),
            }
            if kind == "no-area" and missing_area:
                del ann["area"]
            annotations.append(ann)
    annotations.append({**annotations[0], "id": 999, "bbox": [W + 1, 2, 3, 3]})  # degenerate: dropped
    categories = [{"id": c, "name": f"c{c}"} for c in (2, 5, 8, 11)]  # 8: a placeholder, no annotation
    ann_file = root / "instances.json"
    ann_file.write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))
    return images_dir, ann_file


def reference(ann_file: Path, crowd_as_instances: bool = False) -> tuple[dict[int, dict], COCO]:
    """The targets and ground truth as the dataset built them before the store: the JSON's records,
    validated, each target from its annotation dicts and pycocotools' annToRLE."""
    data = json.loads(ann_file.read_text())
    images = validate_images(data["images"], "x")
    categories = validate_categories(data["categories"], "x")
    kept, _ = validate_annotations(data["annotations"], images, categories, "x")
    if crowd_as_instances:
        for ann in kept:
            ann["iscrowd"] = 0
    coco = COCO()
    coco.dataset = {**data, "annotations": kept}
    coco.createIndex()
    labels = {cid: i for i, cid in enumerate(sorted(categories), start=1)}
    targets = {}
    for iid, img in images.items():
        anns = [a for a in kept if a["image_id"] == iid and not a["iscrowd"]]
        w, h = img["width"], img["height"]
        if anns:
            boxes = torch.tensor([clipped_xyxy(a["bbox"], w, h) for a in anns], dtype=torch.float32)
            rles = [coco.annToRLE(a) for a in anns]
            masks = torch.from_numpy(np.ascontiguousarray(decode_masks(rles).transpose(2, 0, 1)))
        else:
            boxes, masks = torch.zeros((0, 4)), torch.zeros((0, h, w), dtype=torch.uint8)
        targets[iid] = {
            "boxes": boxes,
            "labels": torch.tensor([labels[a["category_id"]] for a in anns], dtype=torch.int64),
            "masks": masks,
            "image_id": iid,
            "area": torch.tensor([a["area"] for a in anns], dtype=torch.float32),
            "iscrowd": torch.zeros((len(anns),), dtype=torch.int64),
        }
    return targets, coco


def assert_same_target(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            assert got[key].dtype == value.dtype and got[key].shape == value.shape, key
            assert torch.equal(got[key], value), key
        else:
            assert got[key] == value, key


@pytest.mark.parametrize("cached", [False, True])
@pytest.mark.parametrize("crowd_as_instances", [False, True])
@pytest.mark.parametrize("missing_area", [True, False], ids=["json-path", "fast-path"])
def test_targets_and_ground_truth_are_the_jsons(
    tmp_path: Path, cached: bool, crowd_as_instances: bool, missing_area: bool
) -> None:
    images_dir, ann_file = write_mixed_set(tmp_path, missing_area=missing_area)
    want, coco = reference(ann_file, crowd_as_instances)
    cache = tmp_path / "cache" if cached else None
    for _ in range(2 if cached else 1):  # cached: built, then read back from the file
        dataset = CocoInstanceDataset(images_dir, ann_file, cache_dir=cache, crowd_as_instances=crowd_as_instances)
        assert dataset.image_ids == sorted(want)
        for index, image_id in enumerate(dataset.image_ids):
            image, target = dataset[index]
            assert image.shape == (3, H, W)
            assert_same_target(target, want[image_id])
        ours = dataset.coco.dataset
        keys = ("id", "image_id", "category_id", "bbox", "area", "iscrowd", "segmentation")
        theirs = [{k: a[k] for k in keys} for a in coco.dataset["annotations"]]
        assert sorted(ours["annotations"], key=lambda a: a["id"]) == sorted(theirs, key=lambda a: a["id"])
        assert sorted(i["id"] for i in ours["images"]) == sorted(coco.getImgIds())
        assert dataset.num_dropped_annotations == 1
        as_filed = reference(ann_file)[1]  # the counts are of the file's crowd flags, whatever the option
        assert (dataset.instance_counts, dataset.crowd_counts) == (
            _counts(as_filed, crowd=False),
            _counts(as_filed, crowd=True),
        )
    if cached:
        assert len(list(cache.glob("*.samples"))) == 1


def _counts(coco: COCO, crowd: bool) -> dict[int, int]:
    from collections import Counter

    return Counter(a["category_id"] for a in coco.dataset["annotations"] if bool(a["iscrowd"]) == crowd)


def test_a_split_of_the_file_keeps_its_images_only(tmp_path: Path) -> None:
    images_dir, ann_file = write_mixed_set(tmp_path)
    want, _ = reference(ann_file)
    dataset = CocoInstanceDataset(images_dir, ann_file, image_ids=[20, 4, 9], cache_dir=tmp_path / "cache")
    assert dataset.image_ids == [4, 9, 20]
    for index, image_id in enumerate(dataset.image_ids):
        assert_same_target(dataset[index][1], want[image_id])
    assert {i["id"] for i in dataset.coco.dataset["images"]} == {4, 9, 20}
    without = CocoInstanceDataset.of(dataset.split, dropped={9})  # a bad image left out, as the check does
    assert without.image_ids == [4, 20] and len(without) == 2 and len(dataset) == 3
    with pytest.raises(DatasetError, match="does not list, e.g. \\[55\\]"):
        CocoInstanceDataset(images_dir, ann_file, image_ids=[4, 55])


def test_a_far_point_is_named_by_the_vectorised_check(tmp_path: Path) -> None:
    images_dir, ann_file = write_mixed_set(tmp_path)
    data = json.loads(ann_file.read_text())
    data["annotations"][30]["segmentation"] = [[1, 1, 5, 1, 5, 4, 1, 1e6]]
    ann_file.write_text(json.dumps(data))
    with pytest.raises(DatasetError, match=f"annotation id {data['annotations'][30]['id']} .*far outside"):
        CocoInstanceDataset(images_dir, ann_file)
    data["annotations"][30]["segmentation"] = [[1, 1, 5, 1, 5, "x", 1, 2]]
    ann_file.write_text(json.dumps(data))
    with pytest.raises(DatasetError, match=f"annotation id {data['annotations'][30]['id']} .*flat list of numbers"):
        CocoInstanceDataset(images_dir, ann_file)


# --- the cache -------------------------------------------------------------------------------------


def _samples_file(cache: Path) -> Path:
    (found,) = cache.glob("*.samples")
    return found


def _no_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(path: Path) -> None:
        raise AssertionError(f"parsed {path} though its cache is valid")

    monkeypatch.setattr(read, "read_store", refuse)


def test_a_valid_cache_is_used_without_parsing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    images_dir, ann_file = write_mixed_set(tmp_path)
    CocoInstanceDataset(images_dir, ann_file, cache_dir=tmp_path / "cache")
    _no_parse(monkeypatch)
    dataset = CocoInstanceDataset(images_dir, ann_file, cache_dir=tmp_path / "cache")
    assert isinstance(dataset.store.arrays["coords"].base, memoryview | np.ndarray)
    assert not dataset.store.arrays["coords"].flags.writeable  # mapped read-only from the file


def test_a_changed_annotation_file_rebuilds_the_cache(tmp_path: Path) -> None:
    images_dir, ann_file = write_mixed_set(tmp_path)
    first = CocoInstanceDataset(images_dir, ann_file, cache_dir=tmp_path / "cache")
    before = first[0][1]
    data = json.loads(ann_file.read_text())
    for ann in data["annotations"]:
        ann["bbox"] = [0, 0, 2, 2]  # same size of file is not needed: any change of its bytes or time
    ann_file.write_text(json.dumps(data))
    os.utime(ann_file, ns=(1, 1))  # even an mtime from the past: the key is not "newer than"
    second = CocoInstanceDataset(images_dir, ann_file, cache_dir=tmp_path / "cache")
    want, _ = reference(ann_file)
    assert_same_target(second[0][1], want[second.image_ids[0]])
    assert not torch.equal(second[0][1]["boxes"], before["boxes"])
    assert len(list((tmp_path / "cache").glob("*.samples"))) == 1  # replaced, not added


@pytest.mark.parametrize(
    "damage,reason",
    [
        ("flip-payload-byte", "checksum mismatch (damaged)"),
        ("truncate", "(truncated?)"),
        ("truncate-header", "shorter than its header (truncated)"),
        ("garbage-header", "header is not readable (damaged)"),
        ("other-version", "format version 0, this program writes 1"),
        ("empty", "shorter than its header (truncated)"),
        ("append", "where the header promises"),
    ],
)
def test_a_damaged_cache_is_detected_and_rebuilt(
    tmp_path: Path, damage: str, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    images_dir, ann_file = write_mixed_set(tmp_path)
    CocoInstanceDataset(images_dir, ann_file, cache_dir=tmp_path / "cache")
    path = _samples_file(tmp_path / "cache")
    raw = bytearray(path.read_bytes())
    if damage == "flip-payload-byte":
        raw[HEADER_SIZE + len(raw[HEADER_SIZE:]) // 2] ^= 0x40
    elif damage == "truncate":
        raw = raw[: len(raw) - 100]
    elif damage == "truncate-header":
        raw = raw[:100]
    elif damage == "garbage-header":
        raw[30:60] = b"x" * 30
    elif damage == "other-version":
        raw = raw.replace(b'"version": 1', b'"version": 0', 1)
    elif damage == "empty":
        raw = bytearray()
    else:
        raw += b"\0" * 64
    path.write_bytes(bytes(raw))
    with caplog.at_level(logging.WARNING):
        dataset = CocoInstanceDataset(images_dir, ann_file, cache_dir=tmp_path / "cache")
    (warning,) = [r.getMessage() for r in caplog.records if "rebuilding" in r.getMessage()]
    assert str(path) in warning and reason in warning
    want, _ = reference(ann_file)
    for index, image_id in enumerate(dataset.image_ids):
        assert_same_target(dataset[index][1], want[image_id])
    CocoInstanceDataset(images_dir, ann_file, cache_dir=tmp_path / "cache")  # the rebuilt file verifies


def _open_and_digest(args: tuple[Path, Path, Path, Path]) -> str:
    images_dir, ann_file, cache, builds = args
    real = read.read_store

    def counted(path: Path, kept: list[object] | None = None) -> store.SampleStore:
        with open(builds, "a") as f:
            f.write(f"{os.getpid()}\n")
        return real(path, kept)

    read.read_store = counted  # this child's module only
    dataset = CocoInstanceDataset(images_dir, ann_file, cache_dir=cache, cache_wait_s=60)
    digest = [dataset[i][1] for i in range(len(dataset))]
    return repr([(t["image_id"], t["boxes"].tolist(), t["masks"].sum().item()) for t in digest])


def test_processes_starting_at_once_agree_and_one_builds(tmp_path: Path) -> None:
    images_dir, ann_file = write_mixed_set(tmp_path)
    builds = tmp_path / "builds.txt"
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    args = (images_dir, ann_file, tmp_path / "cache", builds)
    # Processes, not a pool: a pool's daemonic workers may not fork the builder's child.
    ranks = [context.Process(target=lambda: results.put(_open_and_digest(args))) for _ in range(3)]
    for rank in ranks:
        rank.start()
    digests = [results.get(timeout=60) for _ in ranks]
    for rank in ranks:
        rank.join(timeout=60)
        assert rank.exitcode == 0
    assert len(set(digests)) == 1
    assert len(builds.read_text().split()) == 1  # one parsed the file; the others waited and mapped it


def test_a_cache_folder_that_cannot_be_written_falls_back_to_memory(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    images_dir, ann_file = write_mixed_set(tmp_path)
    (tmp_path / "a-file").write_text("where the cache's parent folder would be")
    with caplog.at_level(logging.WARNING):
        dataset = CocoInstanceDataset(images_dir, ann_file, cache_dir=tmp_path / "a-file" / "cache")
    assert any("kept in memory" in r.getMessage() for r in caplog.records)
    want, _ = reference(ann_file)
    assert_same_target(dataset[0][1], want[dataset.image_ids[0]])


# --- the data check's verdicts --------------------------------------------------------------------


def test_check_verdicts_are_reused_until_an_image_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    images_dir, ann_file = write_mixed_set(tmp_path)
    dataset = CocoInstanceDataset(images_dir, ann_file, cache_dir=tmp_path / "cache")
    rules = CheckRules("header")
    (first,) = check_datasets([dataset], rules, cache_dir=tmp_path / "cache")
    assert first.reused == 0 and not first.bad and first.frames[20].applied == 6

    checked: list[int] = []
    from maskrcnn_dist.data.images import check

    real = check.check_image

    def counting(entry: Any, rules: CheckRules) -> Any:
        checked.append(entry.image_id)
        return real(entry, rules)

    monkeypatch.setattr(check, "check_image", counting)
    (second,) = check_datasets([dataset], rules, cache_dir=tmp_path / "cache")
    assert checked == [] and second.reused == len(dataset)
    assert second.frames == first.frames and second.bad == first.bad

    (images_dir / "sub" / "4.png").write_bytes(b"broken now")  # a changed image: checked again, found bad
    (second,) = check_datasets([dataset], rules, cache_dir=tmp_path / "cache")
    assert checked == [4] and [b.image_id for b in second.bad] == [4]
    checked.clear()
    (third,) = check_datasets([dataset], rules, cache_dir=tmp_path / "cache")
    assert checked == [] and [b.image_id for b in third.bad] == [4]  # a bad verdict is cached too

    (second,) = check_datasets([dataset], CheckRules("full"), cache_dir=tmp_path / "cache")
    assert len(checked) == len(dataset)  # other rules: their own cache

    path = next((tmp_path / "cache").glob("*.check-header"))
    raw = path.read_bytes()
    assert raw.count(b"[6,1]") == 1
    path.write_bytes(raw.replace(b"[6,1]", b"[1,1]"))  # still JSON, a wrong frame: the checksum refuses it
    checked.clear()
    (fourth,) = check_datasets([dataset], rules, cache_dir=tmp_path / "cache")
    assert len(checked) == len(dataset) and fourth.frames[20].applied == 6
    path.write_bytes(path.read_bytes()[:-5])  # truncated: not used, everything checked again
    checked.clear()
    check_datasets([dataset], rules, cache_dir=tmp_path / "cache")
    assert len(checked) == len(dataset)


def test_a_bad_file_is_named_when_the_cache_builds_it(tmp_path: Path) -> None:
    """The build runs in a child process: its one-line error reaches the caller as it was."""
    images_dir, ann_file = write_mixed_set(tmp_path)
    data = json.loads(ann_file.read_text())
    data["annotations"][3]["category_id"] = 77
    ann_file.write_text(json.dumps(data))
    with pytest.raises(DatasetError, match=f"^{ann_file}: annotation id .*unknown category id 77"):
        CocoInstanceDataset(images_dir, ann_file, cache_dir=tmp_path / "cache")
    assert not list((tmp_path / "cache").glob("*.samples"))


def test_a_store_read_in_this_process_leaves_the_collector_on(tmp_path: Path) -> None:
    """Only a child about to exit keeps the parse's objects and skips the collector (cache.Build); a process
    that reads a store and goes on (no cache, an unwritable one, a pool worker) collects garbage as before."""
    import gc

    from maskrcnn_dist.data import write_train_val

    write_train_val(tmp_path / "coco", num_train=4, num_val=2, seed=0, image_size=(48, 64), max_objects=2)
    annotations = tmp_path / "coco" / "train" / "annotations.json"
    assert gc.isenabled()
    read.open_store(annotations, None)  # --data-cache off, check-data, predict
    assert gc.isenabled()
    (tmp_path / "file").write_text("")
    read.open_store(annotations, tmp_path / "file" / "cache")  # a cache folder that cannot be made
    assert gc.isenabled()
