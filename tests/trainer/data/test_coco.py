"""CocoInstanceDataset: image files checked up front and decoded on load, targets (masks, boxes, labels),
image modes, flips."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from pycocotools import mask as mask_utils

from maskrcnn_dist.data import CocoInstanceDataset, flip_decision
from maskrcnn_dist.data.transforms.flip import Flipped
from maskrcnn_dist.errors import DatasetError

from .conftest import H, W, annotation_record, dataset_error, image_record, write_set

# --- image files ----------------------------------------------------------------------------------


def test_missing_image_files_are_listed_up_front(tmp_path: Path) -> None:
    image_dir, ann_file = write_set(tmp_path, [], images=[image_record(1), image_record(2), image_record(3)])
    (image_dir / "2.png").unlink()
    (image_dir / "3.png").unlink()
    with pytest.raises(DatasetError) as info:
        CocoInstanceDataset(image_dir, ann_file)
    message = str(info.value)
    assert str(ann_file) in message and "2 of 3" in message
    assert "2.png (image id 2)" in message and "3.png (image id 3)" in message


def test_unreadable_image_fails_on_load_with_path_and_id(tmp_path: Path) -> None:
    image_dir, ann_file = write_set(tmp_path, [], images=[image_record(1), image_record(5)])
    (image_dir / "5.png").write_bytes(b"not a png at all")
    dataset = CocoInstanceDataset(image_dir, ann_file)
    dataset[0]  # the good one loads
    with pytest.raises(DatasetError) as info:
        dataset[1]
    assert str(image_dir / "5.png") in str(info.value) and "image id 5" in str(info.value)


def test_image_size_disagreeing_with_json(tmp_path: Path) -> None:
    image_dir, ann_file = write_set(tmp_path, [])
    Image.new("RGB", (W + 2, H)).save(image_dir / "1.png")
    with pytest.raises(DatasetError, match=r"image id 1\): image is 10x6 but the annotation file says 8x6"):
        CocoInstanceDataset(image_dir, ann_file)[0]


# --- decoding -------------------------------------------------------------------------------------


def test_polygon_mask_and_xyxy_box(tmp_path: Path) -> None:
    image_dir, ann_file = write_set(tmp_path, [annotation_record(1, bbox=[1.5, 1, 3, 2.5])])
    image, target = CocoInstanceDataset(image_dir, ann_file)[0]
    expected = np.zeros((H, W), np.uint8)
    expected[1:4, 1:5] = 1  # the polygon (1,1)-(5,4) covers rows 1..3, columns 1..4
    assert target["masks"].dtype == torch.uint8 and target["masks"].shape == (1, H, W)
    np.testing.assert_array_equal(target["masks"][0].numpy(), expected)
    assert target["boxes"].dtype == torch.float32
    assert target["boxes"].tolist() == [[1.5, 1.0, 4.5, 3.5]]
    assert image.shape == (3, H, W) and image.dtype == torch.float32


def test_boxes_are_clipped_to_the_image(tmp_path: Path) -> None:
    image_dir, ann_file = write_set(
        tmp_path, [annotation_record(1, bbox=[-2, 1, 5, 3]), annotation_record(2, bbox=[6, 4, 5, 5])]
    )
    _, target = CocoInstanceDataset(image_dir, ann_file)[0]
    assert target["boxes"].tolist() == [[0, 1, 3, 4], [6, 4, W, H]]


def test_compressed_and_uncompressed_rle(tmp_path: Path) -> None:
    expected = np.zeros((H, W), np.uint8)
    expected[2:4, 3:5] = 1
    # Hand-written column-major runs: 3 empty columns + 2 rows, 2 ones, 2+2 zeros, 2 ones, rest zeros.
    uncompressed = {"size": [H, W], "counts": [20, 2, 4, 2, 20]}
    compressed = mask_utils.encode(np.asfortranarray(expected))
    compressed = {"size": compressed["size"], "counts": compressed["counts"].decode("ascii")}
    anns = [
        annotation_record(1, segmentation=uncompressed, bbox=[3, 2, 2, 2]),
        annotation_record(2, segmentation=compressed),
    ]
    image_dir, ann_file = write_set(tmp_path, anns)
    _, target = CocoInstanceDataset(image_dir, ann_file)[0]
    for mask in target["masks"]:
        np.testing.assert_array_equal(mask.numpy(), expected)


def test_non_contiguous_category_ids_map_to_contiguous_labels(tmp_path: Path) -> None:
    categories = [{"id": 90, "name": "ninety"}, {"id": 1, "name": "one"}, {"id": 5, "name": "five"}]
    anns = [
        annotation_record(1, category_id=90),
        annotation_record(2, category_id=1),
        annotation_record(3, category_id=5),
    ]
    image_dir, ann_file = write_set(tmp_path, anns, categories=categories)
    dataset = CocoInstanceDataset(image_dir, ann_file)
    assert dataset.num_classes == 4
    assert dataset.label_to_category_id == [-1, 1, 5, 90]
    assert dataset.category_names == ["__background__", "one", "five", "ninety"]
    _, target = dataset[0]
    assert target["labels"].dtype == torch.int64 and target["labels"].tolist() == [3, 1, 2]


def test_images_without_annotations_are_kept(tmp_path: Path) -> None:
    image_dir, ann_file = write_set(
        tmp_path, [annotation_record(1, image_id=2)], images=[image_record(1), image_record(2)]
    )
    dataset = CocoInstanceDataset(image_dir, ann_file)
    assert len(dataset) == 2 and dataset.image_ids == [1, 2]
    _, target = dataset[0]
    assert target["image_id"] == 1
    assert target["boxes"].shape == (0, 4) and target["boxes"].dtype == torch.float32
    assert target["masks"].shape == (0, H, W) and target["masks"].dtype == torch.uint8
    for key in ("labels", "area", "iscrowd"):
        assert target[key].shape == (0,)
    assert dataset[1][1]["boxes"].shape == (1, 4)


@pytest.mark.parametrize("train", [True, False])
def test_crowd_regions_are_validated_but_not_targets(tmp_path: Path, train: bool) -> None:
    crowd = {"size": [H, W], "counts": [H * W - 4, 4]}
    anns = [annotation_record(1), annotation_record(2, segmentation=crowd, iscrowd=1, bbox=[7, 2, 1, 4])]
    image_dir, ann_file = write_set(tmp_path, anns)
    dataset = CocoInstanceDataset(image_dir, ann_file)
    _, target = (Flipped(dataset, 3) if train else dataset)[0]
    assert target["boxes"].shape == (1, 4) and target["iscrowd"].tolist() == [0]
    assert dataset.coco.anns[2]["iscrowd"] == 1  # COCOeval still sees the crowd region

    bad = [annotation_record(1), annotation_record(2, segmentation={"size": [H, W], "counts": [5]}, iscrowd=1)]
    assert "annotation id 2" in dataset_error(tmp_path / "bad", bad)


# --- image modes ----------------------------------------------------------------------------------


def _single_image_dataset(tmp_path: Path, image: Image.Image) -> CocoInstanceDataset:
    image_dir, ann_file = write_set(tmp_path, [])
    image.save(image_dir / "1.png")
    return CocoInstanceDataset(image_dir, ann_file)


def test_grayscale_is_converted_to_rgb(tmp_path: Path) -> None:
    image, _ = _single_image_dataset(tmp_path, Image.new("L", (W, H), 51))[0]
    assert image.shape == (3, H, W) and image.dtype == torch.float32
    assert torch.allclose(image, torch.full((3, H, W), 0.2))


def test_rgba_drops_alpha(tmp_path: Path) -> None:
    image, _ = _single_image_dataset(tmp_path, Image.new("RGBA", (W, H), (255, 0, 51, 0)))[0]
    assert image.shape == (3, H, W)
    assert image[:, 0, 0].tolist() == pytest.approx([1.0, 0.0, 0.2])


def test_palette_with_transparency(tmp_path: Path) -> None:
    palette = Image.new("P", (W, H), 1)
    palette.putpalette([0, 0, 0, 255, 255, 0] + [0] * 762)
    palette.info["transparency"] = 0
    image, _ = _single_image_dataset(tmp_path, palette)[0]
    assert image.shape == (3, H, W) and image[:, 2, 3].tolist() == [1.0, 1.0, 0.0]


def test_sixteen_bit_grayscale_keeps_its_range(tmp_path: Path) -> None:
    array = np.full((H, W), 32768, dtype=np.uint16)
    image, _ = _single_image_dataset(tmp_path, Image.fromarray(array))[0]
    assert image.shape == (3, H, W) and image.max() <= 1.0
    assert image[0, 0, 0].item() == pytest.approx(32768 / 65535, abs=1e-4)


def test_aspect_ratios_come_from_the_json(tmp_path: Path) -> None:
    images = [image_record(1), {"id": 2, "file_name": "2.png", "width": 4, "height": 8}]
    image_dir, ann_file = write_set(tmp_path, [], images=images)
    assert CocoInstanceDataset(image_dir, ann_file).aspect_ratios() == [W / H, 0.5]


# --- flips ----------------------------------------------------------------------------------------


def _flip_dataset(tmp_path: Path, *, train: bool, flip_seed: int = 3) -> CocoInstanceDataset | Flipped:
    image_dir, ann_file = write_set(tmp_path, [annotation_record(1, bbox=[1, 1, 4, 3])])
    pixels = np.arange(H * W * 3, dtype=np.uint8).reshape(H, W, 3)  # no symmetry: a flip shows
    Image.fromarray(pixels).save(image_dir / "1.png")
    dataset = CocoInstanceDataset(image_dir, ann_file)
    return Flipped(dataset, flip_seed) if train else dataset


def _mask_box(mask: torch.Tensor) -> list[float]:
    ys, xs = torch.nonzero(mask, as_tuple=True)
    return [xs.min().item(), ys.min().item(), xs.max().item() + 1, ys.max().item() + 1]


def test_flip_decisions_are_deterministic_and_vary() -> None:
    decisions = [flip_decision(3, epoch, i) for epoch in range(2) for i in range(200)]
    assert decisions == [flip_decision(3, epoch, i) for epoch in range(2) for i in range(200)]
    assert decisions[:200] != decisions[200:]  # the epoch matters
    assert decisions[:200] != [flip_decision(4, 0, i) for i in range(200)]  # the seed matters
    assert 70 < sum(decisions) < 330  # about half are flipped


def test_flip_moves_image_box_and_mask_together(tmp_path: Path) -> None:
    plain_image, plain = _flip_dataset(tmp_path, train=False)[0]
    dataset = _flip_dataset(tmp_path, train=True)
    epoch_flip = next(e for e in range(50) if flip_decision(3, e, 0))
    epoch_keep = next(e for e in range(50) if not flip_decision(3, e, 0))

    dataset.set_epoch(epoch_keep)
    image, target = dataset[0]
    assert torch.equal(image, plain_image) and torch.equal(target["boxes"], plain["boxes"])

    dataset.set_epoch(epoch_flip)
    image, target = dataset[0]
    assert torch.equal(image, plain_image.flip(-1))
    assert torch.equal(target["masks"], plain["masks"].flip(-1))
    assert target["boxes"].tolist() == [[W - 5, 1, W - 1, 4]]
    assert _mask_box(target["masks"][0]) == target["boxes"][0].tolist()  # box and mask still agree

    resumed = _flip_dataset(tmp_path / "resumed", train=True)  # a new process: same seed, same epoch
    resumed.set_epoch(epoch_flip)
    resumed_image, resumed_target = resumed[0]
    assert torch.equal(resumed_image, image) and torch.equal(resumed_target["boxes"], target["boxes"])


def test_no_flips_in_eval_mode(tmp_path: Path) -> None:
    dataset = _flip_dataset(tmp_path, train=False)
    plain_image, _ = dataset[0]
    assert not hasattr(dataset, "set_epoch")  # the dataset has no epoch: flips are a transform's
    assert torch.equal(dataset[0][0], plain_image)
