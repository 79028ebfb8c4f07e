"""predict and the gallery read a photo in the frame the data check decides: detections.json in the
annotation file's frame (a split) or the display frame (a file by itself), the drawings in the display
frame, the object where a viewer shows it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import maskrcnn_dist.outputs.gallery as gallery
from maskrcnn_dist.config import PredictConfig
from maskrcnn_dist.outputs.predict import IMAGES_FILE, RESULTS_FILE, legible_scale, predict_images

from ..data.photos import OBJECT, SHOWN, encode, red_box, shown_photo, stored_for, write_coco

STORED = (SHOWN[1], SHOWN[0])  # a photo under orientation 6 is stored 40 wide, 60 high
SCALE = legible_scale(torch.zeros(3, SHOWN[1], SHOWN[0]))  # predict enlarges drawings of small images


def _photo(path: Path, orientation: int = 6) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(encode(stored_for(shown_photo(), orientation), "jpeg-exif", orientation))
    return path


def _object_is_red_in(drawing: np.ndarray, box: tuple[int, int, int, int]) -> bool:
    x0, y0, x1, y1 = (v * SCALE for v in box)
    inside = drawing[y0 + SCALE : y1 - SCALE, x0 + SCALE : x1 - SCALE].reshape(-1, 3).mean(axis=0)
    return bool(inside[0] > 200 and inside[1] < 60 and inside[2] < 60)


def _read(out: Path) -> tuple[dict, list[dict], np.ndarray]:
    (image,) = json.loads((out / IMAGES_FILE).read_text())["images"]
    drawing = np.asarray(Image.open(out / image["drawing"]).convert("RGB"))
    return image, json.loads((out / RESULTS_FILE).read_text()), drawing


@pytest.mark.parametrize(("policy", "frame"), [("auto", SHOWN), ("ignore", STORED)])
def test_a_file_by_itself_is_predicted_and_drawn_as_shown(trained: Path, tmp_path: Path, policy: str, frame):
    photo = _photo(tmp_path / "in" / "portrait.jpg")
    flags = {"resume": trained, "device": "cpu", "exif-orientation": policy}
    predict_images([photo], PredictConfig(out=tmp_path / "out", score_threshold=1.0), flags)
    image, results, drawing = _read(tmp_path / "out")
    assert (image["width"], image["height"]) == frame  # the frame of detections.json
    assert all(
        r["bbox"][0] + r["bbox"][2] <= frame[0] + 1e-3 and r["bbox"][1] + r["bbox"][3] <= frame[1] + 1e-3
        for r in results
    )
    assert drawing.shape[:2] == (frame[1] * SCALE, frame[0] * SCALE)
    if policy == "auto":
        assert _object_is_red_in(drawing, OBJECT)  # the object where a viewer shows it


def test_a_split_annotated_as_stored_is_predicted_in_that_frame_and_drawn_as_shown(trained: Path, tmp_path: Path):
    stored = stored_for(shown_photo(), 6)
    data = tmp_path / "data"
    for split in ("train", "val"):
        write_coco(data / split, [("portrait.jpg", encode(stored, "jpeg-exif", 6), stored.size, red_box(stored))])
    # the checkpoint's 3 categories: the same one three times under different ids
    for split in ("train", "val"):
        coco = json.loads((data / split / "annotations.json").read_text())
        coco["categories"] = [{"id": c, "name": f"c{c}"} for c in (17, 27, 37)]
        coco["annotations"][0]["category_id"] = 17
        (data / split / "annotations.json").write_text(json.dumps(coco))
    options = PredictConfig(out=tmp_path / "out", score_threshold=1.0)
    predict_images([], options, {"resume": trained, "device": "cpu", "data-path": data})
    image, _, drawing = _read(tmp_path / "out")
    assert (image["width"], image["height"]) == STORED  # the annotation file's frame: results score against it
    assert drawing.shape[:2] == (SHOWN[1] * SCALE, SHOWN[0] * SCALE)  # drawn as shown
    assert _object_is_red_in(drawing, OBJECT)

    rows = []
    original = gallery.gallery_figure
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gallery, "gallery_figure", lambda r, *a: rows.extend(r) or original(r, *a))
        gallery.draw_gallery(trained, 1, tmp_path / "gallery.png", data_path=data, score_threshold=1.0)
    ((_, predicted, truth),) = rows
    for drawing in (predicted, truth):
        assert tuple(drawing.shape[-2:]) == (SHOWN[1] * SCALE, SHOWN[0] * SCALE)
    assert _object_is_red_in(predicted.permute(1, 2, 0).numpy(), OBJECT)
