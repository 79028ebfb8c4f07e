"""EXIF orientation (data/images/orientation.py): the frame each image is read in, decided once by one function
for the check and the loader, and the pixels: the mask lands on the object in the annotation's frame,
for every orientation, in every container Pillow reads one from."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

from maskrcnn_dist.data import CocoInstanceDataset, SplitSource, build_eval_loader
from maskrcnn_dist.data.dataset import Split
from maskrcnn_dist.data.images.check import CheckRules, check_datasets, check_images
from maskrcnn_dist.data.images.orientation import AS_STORED, DISPLAY_TRANSPOSE, Frame, FrameMismatch, decide_frame
from maskrcnn_dist.data.prepare import built
from maskrcnn_dist.errors import DatasetError

from .photos import CONTAINERS, OBJECT, SHOWN, encode, red_box, shown_photo, stored_for, write_coco

SUFFIX = {"jpeg": "jpg", "png": "png", "webp": "webp", "tiff": "tif"}
STORED_TURNED = (SHOWN[1], SHOWN[0])  # the stored size of a photo under orientations 5-8


def test_the_transpose_table_is_pillows_exif_transpose():
    shown = shown_photo()
    for orientation, method in DISPLAY_TRANSPOSE.items():
        stored = stored_for(shown, orientation)  # found with exif_transpose as the oracle
        np.testing.assert_array_equal(np.asarray(stored.transpose(method)), np.asarray(shown), str(orientation))


# --- the decision: every orientation, both frames, every setting ------------------------------------------


def _expected(orientation: int, frame: str, policy: str) -> Frame | str:
    """What the README's rule says for a photo shown 60x40, annotated in `frame` (display or stored)."""
    turned = orientation >= 5
    stored = STORED_TURNED if turned else SHOWN
    annotated = SHOWN if frame == "display" else stored
    shown = f"image is stored {stored[0]}x{stored[1]} with EXIF orientation {orientation} (shown 60x40); "
    says = f"the annotation file says {annotated[0]}x{annotated[1]}"
    if orientation == 1 or (not turned and policy != "ignore"):
        return Frame(orientation) if policy != "ignore" else AS_STORED
    if policy == "ignore":
        if annotated == stored:
            return AS_STORED
        return shown + says + ", the shown size: --exif-orientation ignore reads it as stored (auto or apply: as shown)"
    if frame == "display":
        return Frame(orientation)
    if policy == "auto":
        return Frame(1, to_display=orientation)
    return shown + says + ", the stored size: --exif-orientation apply reads it as shown (auto or ignore: as stored)"


@pytest.mark.parametrize("policy", ["auto", "apply", "ignore"])
@pytest.mark.parametrize("frame", ["display", "stored"])
@pytest.mark.parametrize("orientation", range(1, 9))
def test_the_frame_decided_or_the_reason(orientation: int, frame: str, policy: str):
    stored = STORED_TURNED if orientation >= 5 else SHOWN
    annotated = SHOWN if frame == "display" else stored
    expected = _expected(orientation, frame, policy)
    if isinstance(expected, Frame):
        assert decide_frame(stored, orientation, annotated, policy) == expected
    else:
        with pytest.raises(FrameMismatch) as info:
            decide_frame(stored, orientation, annotated, policy)
        assert str(info.value) == expected


def test_a_size_no_frame_has_names_the_orientation():
    with pytest.raises(FrameMismatch) as info:
        decide_frame((1200, 1800), 6, (1000, 700), "auto")
    assert str(info.value) == (
        "image is stored 1200x1800 with EXIF orientation 6 (shown 1800x1200); the annotation file says 1000x700"
    )
    with pytest.raises(FrameMismatch, match=r"^image is 1200x1800 but the annotation file says 1000x700$"):
        decide_frame((1200, 1800), 1, (1000, 700), "auto")


@pytest.mark.parametrize("orientation", range(5, 9))
def test_square_images_follow_the_display_frame(orientation: int):
    assert decide_frame((50, 50), orientation, (50, 50), "auto") == Frame(orientation)
    assert decide_frame((50, 50), orientation, None, "auto") == Frame(orientation)  # a file given by itself
    assert decide_frame((50, 50), orientation, None, "ignore") == AS_STORED


# --- the pixels: the mask lands on the object in the annotation's frame ------------------------------------


def _photo_set(root: Path, orientation: int, frame: str, container: str = "jpeg-exif") -> Path:
    """One photo with `orientation` in `container`, its object annotated where a tool would draw it in
    `frame`: on the shown photo, or on the stored pixels."""
    shown = shown_photo()
    stored = stored_for(shown, orientation)
    annotated_image = shown if frame == "display" else stored
    name = f"photo.{SUFFIX[container.split('-')[0]]}"
    data = encode(stored, container, orientation)
    return write_coco(root, [(name, data, annotated_image.size, red_box(annotated_image))])


def _assert_mask_on_the_object(image: torch.Tensor, target: dict) -> None:
    mask = target["masks"][0].bool()
    assert mask.sum() > 50
    inside = image[:, mask].mean(dim=1)
    assert inside[0] > 0.85 and inside[1] < 0.2 and inside[2] < 0.2, inside  # red, not the grey background
    x0, y0, x1, y1 = target["boxes"][0].tolist()
    assert image[0, int(y0) : int(y1), int(x0) : int(x1)].mean() > 0.85  # the box too


def _checked(annotations: Path, policy: str = "auto") -> CocoInstanceDataset:
    """The split built whole with the frames the check decided (data/prepare.py's way)."""
    split = Split.open(SplitSource(annotations, annotations.parent / "images"), exif_orientation=policy)
    (report,) = check_datasets([split], CheckRules("header", policy))
    (dataset,) = built([split], [report], skip_bad=False)
    return dataset


# Every orientation in both frames: the display frame (auto, apply), and the stored frame, which auto
# tells apart only where the orientation turns the image (5-8) and ignore reads for every orientation.
FRAMES = (
    [(o, "display", "auto") for o in range(1, 9)]
    + [(o, "display", "apply") for o in (2, 5)]
    + [(o, "stored", "auto") for o in range(5, 9)]
    + [(o, "stored", "ignore") for o in range(1, 9)]
)


@pytest.mark.parametrize("checked", [True, False], ids=["checked", "check-off"])
@pytest.mark.parametrize(("orientation", "frame", "policy"), FRAMES)
def test_the_mask_lands_on_the_object(tmp_path: Path, orientation: int, frame: str, policy: str, checked: bool):
    annotations = _photo_set(tmp_path, orientation, frame)
    if checked:
        dataset = _checked(annotations, policy)
    else:
        dataset = CocoInstanceDataset(tmp_path / "images", annotations, exif_orientation=policy)
    image, target = dataset[0]
    _assert_mask_on_the_object(image, target)
    # evaluation reads the same dataset through its loader
    (images,), (targets,) = next(iter(build_eval_loader(dataset, 1)))
    torch.testing.assert_close(images, image)
    _assert_mask_on_the_object(images, targets)


@pytest.mark.parametrize("container", CONTAINERS)
@pytest.mark.parametrize(("orientation", "frame"), [(3, "display"), (6, "display"), (8, "display"), (7, "stored")])
def test_every_container_turns_the_same_way(tmp_path: Path, container: str, orientation: int, frame: str):
    annotations = _photo_set(tmp_path, orientation, frame, container)
    dataset = _checked(annotations)
    expected = Frame(orientation) if frame == "display" else Frame(1, orientation)
    assert dataset.frame(1) == expected
    _assert_mask_on_the_object(*dataset[0])


def test_ignore_reads_the_stored_pixels_even_where_pillow_turns_them(tmp_path: Path):
    """Pillow turns a TIFF by its orientation as it decodes it; --exif-orientation ignore still gets the
    stored pixels (and so does auto for a turned image annotated as stored)."""
    for policy in ("ignore", "auto"):
        root = tmp_path / policy
        annotations = _photo_set(root, 6, "stored", "tiff-tag")
        dataset = _checked(annotations, policy)
        image, target = dataset[0]
        assert tuple(image.shape[-2:]) == (SHOWN[0], SHOWN[1])  # 40 wide, 60 high: stored
        _assert_mask_on_the_object(image, target)


# --- once per image, for everyone ------------------------------------------------------------------------


def test_the_checks_frames_are_what_every_rank_reads(tmp_path: Path, monkeypatch):
    """ddp: rank 0 checks, the others build with its report: they read the frames decided, deciding nothing."""
    annotations = _photo_set(tmp_path, 6, "display")
    source = SplitSource(annotations, tmp_path / "images")
    reports = check_datasets([Split.open(source)], CheckRules("header"))
    assert reports[0].frames == {1: Frame(6)}
    import maskrcnn_dist.data.images.image_file as image_file

    monkeypatch.setattr(image_file, "frame_of", lambda *a: pytest.fail("decided again on another rank"))
    (other_rank,) = built([Split.open(source)], reports, skip_bad=False)
    _assert_mask_on_the_object(*other_rank[0])


def test_one_warning_per_split_counts_images_read_as_stored(tmp_path: Path, caplog):
    shown = shown_photo()
    files = []
    for orientation in (6, 8, 6):
        stored = stored_for(shown, orientation)
        files.append((f"{len(files)}.jpg", encode(stored, "jpeg-exif", orientation), stored.size, red_box(stored)))
    files.append(("3.jpg", encode(stored_for(shown, 6), "jpeg-exif", 6), SHOWN, OBJECT))  # display frame
    dataset = CocoInstanceDataset(tmp_path / "images", write_coco(tmp_path, files))
    with caplog.at_level(logging.WARNING):
        check_datasets([dataset], CheckRules("header"))
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "3 of 4 images have an EXIF orientation that turns them (5-8)" in warning
    assert "image ids 1, 2, 3" in warning


def test_apply_refuses_a_stored_frame_annotation_naming_the_orientation(tmp_path: Path):
    annotations = _photo_set(tmp_path, 6, "stored")
    entries = CocoInstanceDataset(tmp_path / "images", annotations).image_entries()
    (bad,) = check_images(entries, CheckRules("header", "apply")).bad
    assert "with EXIF orientation 6 (shown 60x40); the annotation file says 40x60" in bad.reason
    lazily = CocoInstanceDataset(tmp_path / "images", annotations, exif_orientation="apply")  # --check-data off
    with pytest.raises(DatasetError, match=r"photo.jpg \(image id 1\): image is stored 40x60 with EXIF orientation 6"):
        lazily[0]


def test_orientation_values_viewers_ignore_read_as_stored(tmp_path: Path):
    files = []
    for value in (0, 9, 300):
        exif = Image.Exif()
        exif[0x0112] = value
        path = tmp_path / f"{value}.jpg"
        shown_photo().save(path, exif=exif)
        with Image.open(path) as im:
            assert ImageOps.exif_transpose(im).size == SHOWN  # Pillow ignores it too
        files.append((path.name, path.read_bytes(), SHOWN, OBJECT))
    dataset = CocoInstanceDataset(tmp_path / "images", write_coco(tmp_path, files))
    report = check_images(dataset.image_entries(), CheckRules("header"))
    assert not report.bad and set(report.frames.values()) == {AS_STORED}
