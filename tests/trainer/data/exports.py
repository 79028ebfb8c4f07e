"""Tiny datasets laid out and encoded as annotation tools export them (from each tool's documented
format), for the layout detection tests: 1-3 JPEGs of 64x48 per split, one square object each."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

W, H = 64, 48

LABEL_STUDIO_UP = "." + "./"  # the parent folder, as Label Studio's file_names start


def _polygon(image_id: int, ann_id: int, category_id: int) -> dict[str, Any]:
    x, y = 8 + 4 * (ann_id % 3), 8
    return {
        "id": ann_id,
        "image_id": image_id,
        "category_id": category_id,
        "bbox": [x, y, 24, 20],
        "segmentation": [[x, y, x + 24, y, x + 24, y + 20, x, y + 20]],
        "area": 480.0,
        "iscrowd": 0,
    }


def _brush(image_id: int, ann_id: int, category_id: int) -> dict[str, Any]:
    """CVAT's brush (mask) annotation: an uncompressed RLE with iscrowd 1."""
    mask = np.zeros((H, W), dtype=np.uint8)
    mask[20:40, 30:56] = 1
    rle = {"size": [H, W], "counts": _uncompressed(mask)}
    return {**_polygon(image_id, ann_id, category_id), "segmentation": rle, "bbox": [30, 20, 26, 20], "iscrowd": 1}


def _uncompressed(mask: Any) -> list[int]:
    flat = mask.flatten(order="F").tolist()
    runs, current, count = [], 0, 0
    for value in flat:
        if value != current:
            runs.append(count)
            current, count = value, 0
        count += 1
    runs.append(count)
    return runs


def write_split(
    ann_file: Path,
    image_dir: Path,
    file_names: list[str],
    categories: list[dict[str, Any]],
    labels: list[int],
    brush: tuple[int, ...] = (),
    first_id: int = 1,
) -> None:
    """An instances JSON listing `file_names` (written as JPEGs under `image_dir` by their base name),
    image k holding one object of category labels[k % len(labels)] (a brush mask for those in `brush`)."""
    images, annotations = [], []
    for k, name in enumerate(file_names):
        iid = first_id + k
        path = image_dir / name.replace("\\", "/").split("/")[-1]
        path.parent.mkdir(parents=True, exist_ok=True)
        picture = Image.new("RGB", (W, H), (30, 30, 30))
        picture.paste((220, 200, 40), (8, 8, 40, 30))
        picture.save(path, quality=95)
        images.append({"id": iid, "file_name": name, "width": W, "height": H})
        category = labels[k % len(labels)]
        annotations.append((_brush if category in brush else _polygon)(iid, iid, category))
    ann_file.parent.mkdir(parents=True, exist_ok=True)
    ann_file.write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))


def _cats(*names: str, first: int = 1, **extra: Any) -> list[dict[str, Any]]:
    return [{"id": first + i, "name": name, **extra} for i, name in enumerate(names)]


@dataclass(frozen=True)
class Export:
    """A tool's export: how to write it, the classes a model must get, whether it has a val split."""

    name: str
    write: Callable[[Path], None]
    classes: tuple[str, ...]
    has_val: bool


def roboflow(root: Path) -> None:
    """Roboflow "COCO Segmentation": train/valid/test folders, _annotations.coco.json beside the images;
    category 0 is the project (supercategory of the others, no objects)."""
    cats = [{"id": 0, "name": "shapes", "supercategory": "none"}, *_cats("circle", "square", supercategory="shapes")]
    for split, count in (("train", 3), ("valid", 1), ("test", 1)):
        names = [f"img{k}_jpg.rf.{split}{k}.jpg" for k in range(count)]
        write_split(root / split / "_annotations.coco.json", root / split, names, cats, [1, 2])


def cvat_task(root: Path) -> None:
    """CVAT "COCO 1.0" of a task: annotations/instances_default.json + images/; brush masks are RLE
    with iscrowd 1 (here all of class "road")."""
    cats = _cats("car", "road", supercategory="")
    names = ["frame_000000.jpg", "frame_000001.jpg", "frame_000002.jpg"]
    write_split(root / "annotations" / "instances_default.json", root / "images", names, cats, [1, 2], brush=(2,))


def cvat_project(root: Path) -> None:
    """CVAT "COCO 1.0" of a project with subsets: instances_<Subset>.json + images/<Subset>/."""
    cats = _cats("person", "bike", supercategory="")
    for subset, count in (("Train", 2), ("Validation", 1)):
        names = [f"{subset.lower()}_{k}.jpg" for k in range(count)]
        write_split(root / "annotations" / f"instances_{subset}.json", root / "images" / subset, names, cats, [1, 2])


def label_studio(root: Path) -> None:
    """Label Studio "COCO": result.json + images/, file_names `images/...` or an upload path."""
    cats = _cats("leaf", "stem", first=0)
    # Label Studio's upload path, relative to its own media root, not to anything here (spelt so that
    # tests/test_checkout_guard.py does not take it for a path leaving this checkout).
    upload = LABEL_STUDIO_UP * 2 + "data/upload/1/d4e5f6-stem.jpg"
    names = ["images/a1b2c3-leaf.jpg", upload]
    write_split(root / "result.json", root / "images", names, cats, [0, 1])


def labelme_example(root: Path) -> None:
    """labelme's examples/instance_segmentation/labelme2coco.py: annotations.json + JPEGImages/,
    file_names `JPEGImages/...`, `_background_` as category 0."""
    cats = [{"id": 0, "name": "_background_", "supercategory": None}, *_cats("cat", "dog", supercategory=None)]
    names = ["JPEGImages/2011_000003.jpg", "JPEGImages/2011_000006.jpg"]
    write_split(root / "annotations.json", root / "JPEGImages", names, cats, [1, 2])


def labelme2coco_package(root: Path) -> None:
    """The labelme2coco package: train.json and val.json in the output folder, file_names the image
    paths as given to it (here a sibling folder)."""
    cats = _cats("apple", "pear", first=0)
    write_split(root / "train.json", root / "data", ["data/a.jpg", "data/b.jpg"], cats, [0, 1])
    write_split(root / "val.json", root / "data", ["data/c.jpg"], cats, [0, 1], first_id=10)


def fiftyone(root: Path) -> None:
    """FiftyOne COCODetectionDataset: data/ + labels.json."""
    write_split(root / "labels.json", root / "data", ["000001.jpg", "000002.jpg"], _cats("boat", "buoy"), [1, 2])


def datumaro(root: Path) -> None:
    """Datumaro "coco_instances": annotations/instances_<subset>.json + images/<subset>/."""
    cats = _cats("tree", "rock", supercategory="")
    write_split(
        root / "annotations" / "instances_train.json", root / "images" / "train", ["t1.jpg", "t2.jpg"], cats, [1, 2]
    )
    write_split(
        root / "annotations" / "instances_val.json", root / "images" / "val", ["v1.jpg"], cats, [1, 2], first_id=7
    )


def supervisely(root: Path) -> None:
    """Supervisely's export to COCO: PROJECT/DATASET/annotations/instances.json + PROJECT/DATASET/images/."""
    base = root / "my_project" / "ds0"
    write_split(
        base / "annotations" / "instances.json", base / "images", ["s1.jpg", "s2.jpg"], _cats("can", "cup"), [1, 2]
    )


def makesense(root: Path) -> None:
    """makesense.ai: one JSON named after the project and time, saved beside the photo folder."""
    cats = _cats("nut", "bolt")
    write_split(root / "labels_my-project_2024-05-01-10-00-00.json", root / "photos", ["n.jpg", "b.jpg"], cats, [1, 2])


def team_own(root: Path) -> None:
    """A team's own files: train.json and val.json beside one photo folder."""
    cats = _cats("cell", "nucleus")
    write_split(root / "train.json", root / "photos", ["p1.jpg", "p2.jpg"], cats, [1, 2])
    write_split(root / "val.json", root / "photos", ["p3.jpg"], cats, [1, 2], first_id=5)


def coco2017_no_val(root: Path) -> None:
    """COCO 2017 with train only: the instances file beside its keypoints and captions files."""
    cats = _cats("person", "bicycle", supercategory="vehicle")
    names = ["000000000009.jpg", "000000000025.jpg"]
    write_split(root / "annotations" / "instances_train2017.json", root / "train2017", names, cats, [1, 2])
    captions = {"images": [], "annotations": [{"id": 1, "image_id": 9, "caption": "a person"}], "categories": []}
    (root / "annotations" / "captions_train2017.json").write_text(json.dumps(captions))
    keypoints = json.loads((root / "annotations" / "instances_train2017.json").read_text())
    keypoints["categories"] = [{"id": 1, "name": "person", "keypoints": ["nose"], "skeleton": []}]
    keypoints["annotations"] = [a for a in keypoints["annotations"] if a["category_id"] == 1]
    (root / "annotations" / "person_keypoints_train2017.json").write_text(json.dumps(keypoints))


def mmdetection(root: Path) -> None:
    """MMDetection's custom COCO dataset: annotations/train.json, annotations/val.json + images/."""
    cats = _cats("balloon", "kite")
    write_split(root / "annotations" / "train.json", root / "images", ["b1.jpg", "b2.jpg"], cats, [1, 2])
    write_split(root / "annotations" / "val.json", root / "images", ["b3.jpg"], cats, [1, 2], first_id=3)


def lvis_v1(root: Path) -> None:
    """LVIS v1 as downloaded, in MMDetection's layout: annotations/lvis_v1_{train,val}.json beside COCO
    2017's train2017/ and val2017/. Its images carry `coco_url` and no `file_name`, its annotations no
    `iscrowd`, and its val split holds images of COCO's train2017 too."""
    cats = _cats("aerosol_can", "air_conditioner", **{"frequency": "c", "synonyms": [], "synset": "x.n.01", "def": ""})
    write_split(root / "annotations" / "lvis_v1_train.json", root / "train2017", ["9.jpg", "25.jpg"], cats, [1, 2])
    write_split(
        root / "annotations" / "lvis_v1_val.json", root / "val2017", ["139.jpg", "30.jpg"], cats, [1, 2], first_id=139
    )
    (root / "val2017" / "30.jpg").rename(root / "train2017" / "30.jpg")  # a train2017 image in LVIS's val
    for split in ("train", "val"):
        path = root / "annotations" / f"lvis_v1_{split}.json"
        data = json.loads(path.read_text())
        for image in data["images"]:
            name = image.pop("file_name")
            folder = "val2017" if (root / "val2017" / name).is_file() else "train2017"
            image.update(coco_url=f"http://images.cocodataset.org/{folder}/{name}", flickr_url="http://farm.x/1.jpg")
        for annotation in data["annotations"]:
            del annotation["iscrowd"]
        path.write_text(json.dumps(data))


EXPORTS = (
    Export("roboflow", roboflow, ("circle", "square"), True),
    Export("cvat_task", cvat_task, ("car", "road"), False),
    Export("cvat_project", cvat_project, ("person", "bike"), True),
    Export("label_studio", label_studio, ("leaf", "stem"), False),
    Export("labelme_example", labelme_example, ("cat", "dog"), False),
    Export("labelme2coco_package", labelme2coco_package, ("apple", "pear"), True),
    Export("fiftyone", fiftyone, ("boat", "buoy"), False),
    Export("datumaro", datumaro, ("tree", "rock"), True),
    Export("supervisely", supervisely, ("can", "cup"), False),
    Export("makesense", makesense, ("nut", "bolt"), False),
    Export("team_own", team_own, ("cell", "nucleus"), True),
    Export("coco2017_no_val", coco2017_no_val, ("person", "bicycle"), False),
    Export("mmdetection", mmdetection, ("balloon", "kite"), True),
    Export("lvis_v1", lvis_v1, ("aerosol_can", "air_conditioner"), True),
)
