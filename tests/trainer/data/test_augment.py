"""--data-augmentation multiscale|lsj: the references' compositions with torchvision.transforms.v2 as
the oracle, the fixed-size crop's properties, draws that are a pure function of (seed, epoch, index)."""

from __future__ import annotations

import math
from contextlib import closing

import pytest
import torch
from torchvision import tv_tensors
from torchvision.transforms import v2

from maskrcnn_dist.config import ModelConfig
from maskrcnn_dist.data import BatchLayout, build_step_loader, load_datasets
from maskrcnn_dist.data.transforms.augment import (
    AugmentedDataset,
    FixedSizeCrop,
    augment_batch,
    build_augmentation,
    lsj_side,
    multiscale_sides,
)
from maskrcnn_dist.engines.torch_engine import TorchEngine
from maskrcnn_dist.modeling.model import build_model, side_effect_free_losses
from maskrcnn_dist.seeds import draw_seed
from maskrcnn_dist.trainer_parts import build_trainer, run_metrics

from ..conftest import fast_config

# The references' numbers (references/detection/presets.py), at the model's default 800 / 1333.
REFERENCE_SIDES = [480, 512, 544, 576, 608, 640, 672, 704, 736, 768, 800]
MEAN = (123.0 / 255, 117.0 / 255, 104.0 / 255)


def sample(seed: int = 0, height: int = 60, width: int = 80, objects: int = 3):
    """A random image with rectangular objects, its target as the dataset gives it."""
    g = torch.Generator().manual_seed(seed)
    image = torch.rand(3, height, width, generator=g)
    boxes, masks = [], torch.zeros(objects, height, width, dtype=torch.uint8)
    for i in range(objects):
        x1 = int(torch.randint(0, width - 8, (1,), generator=g))
        y1 = int(torch.randint(0, height - 8, (1,), generator=g))
        x2 = x1 + int(torch.randint(4, min(40, width - x1), (1,), generator=g))
        y2 = y1 + int(torch.randint(4, min(30, height - y1), (1,), generator=g))
        masks[i, y1:y2, x1:x2] = 1
        boxes.append([x1, y1, x2, y2])
    target = {
        "boxes": torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4),
        "labels": torch.arange(1, objects + 1),
        "masks": masks,
        "image_id": seed,
        "area": masks.sum((-1, -2)).float(),
        "iscrowd": torch.zeros(objects, dtype=torch.int64),
    }
    return image, target


def as_inputs(image, target):
    boxes = tv_tensors.BoundingBoxes(target["boxes"], format="XYXY", canvas_size=tuple(image.shape[-2:]))
    return tv_tensors.Image(image), {
        "boxes": boxes,
        "masks": tv_tensors.Mask(target["masks"]),
        "labels": target["labels"],
    }


def reference_fixed_size_crop(image, target, size: int):
    """references/detection/transforms.py FixedSizeCrop as documented there, on plain tensors: one draw r
    for both offsets, boxes shifted and clamped, those with no width or height dropped, pad right/bottom."""
    height, width = image.shape[-2:]
    new_h, new_w = min(height, size), min(width, size)
    boxes, masks, labels = target["boxes"].as_subclass(torch.Tensor).clone(), target["masks"], target["labels"]
    if (new_h, new_w) != (height, width):
        r = torch.rand(1)
        top, left = int(max(height - size, 0) * r), int(max(width - size, 0) * r)
        image = image[..., top : top + new_h, left : left + new_w]
        boxes[:, 0::2] -= left
        boxes[:, 1::2] -= top
        boxes[:, 0::2] = boxes[:, 0::2].clamp(0, new_w)
        boxes[:, 1::2] = boxes[:, 1::2].clamp(0, new_h)
        valid = (boxes[:, 0] < boxes[:, 2]) & (boxes[:, 1] < boxes[:, 3])
        boxes, labels = boxes[valid], labels[valid]
        masks = masks[valid][..., top : top + new_h, left : left + new_w]
    padded = torch.empty(3, size, size)
    padded[:] = torch.tensor(MEAN)[:, None, None]
    padded[:, :new_h, :new_w] = image
    out_masks = torch.zeros(len(masks), size, size, dtype=masks.dtype)
    out_masks[:, :new_h, :new_w] = masks
    return padded, {"boxes": boxes, "masks": out_masks, "labels": labels}


def oracle(name: str, image, target, key: int):
    """torchvision.transforms.v2 composed the references' way, drawing from torch seeded with `key`."""
    torch.manual_seed(key)
    flip_and_sanitize = v2.Compose([v2.RandomHorizontalFlip(0.5), v2.SanitizeBoundingBoxes()])
    if name == "multiscale":
        return v2.Compose([v2.RandomShortestSize(REFERENCE_SIDES, max_size=1333), flip_and_sanitize])(
            *as_inputs(image, target)
        )
    jittered_image, jittered = v2.ScaleJitter((1024, 1024), scale_range=(0.1, 2.0))(*as_inputs(image, target))
    cropped_image, cropped = reference_fixed_size_crop(jittered_image.as_subclass(torch.Tensor), jittered, 1024)
    return flip_and_sanitize(*as_inputs(cropped_image, cropped))


@pytest.mark.parametrize("name", ["multiscale", "lsj"])
def test_the_same_draws_give_torchvisions_images_boxes_and_masks(name: str):
    kit = build_augmentation(name, 800, 1333)
    for index in range(6):
        image, target = sample(index)
        got_image, got = kit(image, target, 7, 2, index)
        want_image, want = oracle(name, image, target, draw_seed(7, 2, index, "augment"))
        torch.testing.assert_close(got_image, want_image.as_subclass(torch.Tensor), rtol=0, atol=0)
        torch.testing.assert_close(got["boxes"], want["boxes"].as_subclass(torch.Tensor), rtol=0, atol=0)
        assert torch.equal(got["masks"], want["masks"].as_subclass(torch.Tensor))
        assert torch.equal(got["labels"], want["labels"])
        if name == "lsj":
            assert got_image.shape == (3, 1024, 1024)


def test_sizes_follow_the_model_size():
    assert multiscale_sides(800) == REFERENCE_SIDES and lsj_side(800) == 1024
    assert multiscale_sides(96)[0] == 58 and multiscale_sides(96)[-1] == 96 and lsj_side(96) == 123


def crop_cases():
    """Images of several shapes through the fixed-size crop alone (to 50 x 50) and through the kit's whole
    lsj at --min-size 39 (a square of 50), at many draws."""
    crop = v2.Compose([FixedSizeCrop((50, 50)), v2.SanitizeBoundingBoxes()])
    kit = build_augmentation("lsj", 39, 39)
    for seed in range(30):
        height, width = ((70, 90), (30, 40), (40, 90), (90, 45))[seed % 4]
        image, target = sample(seed, height, width, objects=4)
        torch.manual_seed(seed)
        out_image, out = crop(*as_inputs(image, target))
        yield image, out_image.as_subclass(torch.Tensor), {k: v.as_subclass(torch.Tensor) for k, v in out.items()}
        yield None, *kit(image, target, 0, 0, seed)


def test_fixed_size_crop_properties():
    emptied = 0
    for image, out_image, out in crop_cases():
        assert out_image.shape == (3, 50, 50) and out["masks"].shape[-2:] == (50, 50)
        assert len(out["boxes"]) == len(out["masks"]) == len(out["labels"])
        boxes = out["boxes"]
        assert ((boxes[:, 2] - boxes[:, 0] >= 1) & (boxes[:, 3] - boxes[:, 1] >= 1)).all()  # no empty box kept
        for box, mask in zip(boxes, out["masks"], strict=True):
            ys, xs = torch.nonzero(mask, as_tuple=True)
            assert len(xs) > 0  # an object kept is still there
            # Inside its box, to the pixel a nearest-neighbour resize may shift an edge by.
            assert box[0] - 1 <= xs.min() and xs.max() <= box[2] and box[1] - 1 <= ys.min() and ys.max() <= box[3]
        if image is not None and image.shape[-2] < 50:
            height = image.shape[-2]  # padded at the bottom with the references' mean colour
            assert torch.allclose(
                out_image[:, height:, :], torch.tensor(MEAN)[:, None, None].expand(3, 50 - height, 50)
            )
        emptied += len(boxes) == 0
    assert emptied < 60


def test_an_image_cropped_to_no_object_still_gives_a_target():
    image, target = sample(0, 200, 200, objects=1)
    target["boxes"] = torch.tensor([[190.0, 190.0, 200.0, 200.0]])
    target["masks"][:] = 0
    target["masks"][0, 190:, 190:] = 1
    torch.manual_seed(0)  # r < 0.9: the crop of 50 at offset 150 r never reaches the object
    out_image, out = v2.Compose([FixedSizeCrop((50, 50)), v2.SanitizeBoundingBoxes()])(*as_inputs(image, target))
    assert out["boxes"].shape == (0, 4) and out["masks"].shape == (0, 50, 50) and len(out["labels"]) == 0
    kit = build_augmentation("lsj", 40, 40)
    _, kit_out = kit(image, target, 0, 0, 0)
    assert kit_out["area"].shape == kit_out["iscrowd"].shape == (len(kit_out["boxes"]),)


@pytest.mark.parametrize("name", ["multiscale", "lsj"])
def test_a_thin_image_keeps_a_pixel_on_every_side(name: str):
    """2000 x 3 passes the model's resize at 800 / 1333 (to 1333 x 1); lsj's jitter to 0.1 x would empty it."""
    image, target = sample(0, 3, 2000, objects=0)
    kit = build_augmentation(name, 800, 1333)
    for index in range(8):
        out_image, out = kit(image, target, 0, 0, index)
        assert min(out_image.shape[-2:]) >= 1 and out["boxes"].shape == (0, 4)


def test_draws_are_a_pure_function_of_seed_epoch_and_index():
    kit = build_augmentation("lsj", 64, 64)
    image, target = sample(1)
    rng = torch.get_rng_state()
    first = kit(image, target, 3, 1, 5)
    assert torch.equal(torch.get_rng_state(), rng)  # no one else's random numbers move
    torch.manual_seed(1234)
    again = kit(image, target, 3, 1, 5)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1]["boxes"], again[1]["boxes"])
    others = [kit(image, target, 3, epoch, 5)[0] for epoch in (2, 3, 4)]
    assert any(o.shape != first[0].shape or not torch.equal(o, first[0]) for o in others)


def test_loader_workers_and_a_resumed_epoch_see_the_same_batches(tiny_coco, tmp_path):
    cfg = fast_config(tiny_coco, tmp_path, **{"data-augmentation": "lsj"})
    train_set, _ = load_datasets(cfg)
    augmented = AugmentedDataset(train_set, build_augmentation("lsj", 96, 96), seed=0)

    def batches(workers: int, start: int):
        loader = build_step_loader(
            augmented, BatchLayout(1, 2), epoch=1, seed=0, num_workers=workers, start_batch=start
        )
        return [(m.images, [t["boxes"] for t in m.targets]) for step in loader for m in step.micro_batches]

    augmented.set_epoch(4)
    kit = build_augmentation("lsj", 96, 96)
    for index in range(6):  # nothing flips before the augmentation (which flips on its own draw)
        assert torch.equal(augmented[index][0], kit(*train_set[index], 0, 4, index)[0])
    whole, resumed = batches(0, 0), batches(2, 3)
    assert len(resumed) == len(whole) - 3
    for (a_images, a_boxes), (b_images, b_boxes) in zip(whole[3:], resumed, strict=True):
        assert all(torch.equal(a, b) for a, b in zip(a_images, b_images, strict=True))
        assert all(torch.equal(a, b) for a, b in zip(a_boxes, b_boxes, strict=True))
    assert {tuple(image.shape) for images, _ in whole for image in images} == {(3, 123, 123)}


def test_the_model_keeps_the_datas_training_sizes_and_resizes_validation():
    model = build_model(ModelConfig(name="maskrcnn_resnet18_fpn", min_size=64, max_size=64), 3, keep_data_sizes=True)
    image, target = sample(0, 123, 123)
    model.train()
    batch, _ = model.transform([image], [dict(target)])
    assert batch.image_sizes == [(123, 123)]
    with side_effect_free_losses(model):
        batch, _ = model.transform([image], [dict(target)])
        assert batch.image_sizes == [(64, 64)]
    assert model.transform._skip_resize
    plain = build_model(ModelConfig(name="maskrcnn_resnet18_fpn", min_size=64, max_size=64), 3)
    plain.train()
    assert plain.transform([image], [dict(target)])[0].image_sizes == [(64, 64)]


def test_profile_measures_the_augmented_sizes():
    images, targets = zip(*(sample(seed) for seed in range(2)))
    kit = build_augmentation("lsj", 64, 64)
    augmented_images, augmented = augment_batch(kit, list(images), list(targets), seed=0)
    assert {tuple(image.shape) for image in augmented_images} == {(3, 82, 82)}
    assert torch.equal(augmented_images[1], kit(images[1], targets[1], 0, 0, 1)[0]) and len(augmented) == 2
    assert augment_batch(None, list(images), list(targets), seed=0) == (list(images), list(targets))


def test_hflip_is_the_datasets_own_flip():
    assert build_augmentation("hflip", 800, 1333) is None


@pytest.mark.parametrize(("name", "paste"), [("multiscale", False), ("lsj", False), ("lsj", True)])
def test_a_run_trains_on_the_augmented_sizes(tiny_coco, tmp_path, name: str, paste: bool):
    """The composition root hands the engine augmented batches (with --use-copypaste, pasted ones), and
    the engine's model keeps their sizes."""
    flags = {"data-augmentation": name, "max-steps": 2, "max-size": 192, "use-copypaste": paste}
    cfg = fast_config(tiny_coco, tmp_path, **flags)
    train_set, val_set = load_datasets(cfg)
    engine = TorchEngine(cfg, train_set.num_classes, iters_per_epoch=6)
    with closing(run_metrics(cfg, True, 2)) as metrics:
        trainer = build_trainer(cfg, engine, train_set, val_set, 6, metrics)
        (micro_batch,) = next(iter(trainer.loader(0, 0))).micro_batches  # one rank: the step's one micro-batch
        images, targets = micro_batch.images, micro_batch.targets
        if name == "lsj":
            assert {tuple(image.shape) for image in images} == {(3, 123, 123)}
        else:  # a short side drawn from the sides at --min-size 96 (int() may floor one a pixel short)
            sides = multiscale_sides(96)
            assert all({min(image.shape[-2:]), min(image.shape[-2:]) + 1} & set(sides) for image in images)
        assert engine.model.transform._skip_resize
        plain_cfg = fast_config(tiny_coco, tmp_path, **{**flags, "use-copypaste": False})
        plain = build_trainer(plain_cfg, engine, train_set, val_set, 6, metrics).loader(0, 0)
        unpasted = [t["labels"].tolist() for t in next(iter(plain)).micro_batches[0].targets]
        assert (unpasted != [t["labels"].tolist() for t in targets]) == paste
        logged = engine.train_step(1, images, targets)
    assert all(math.isfinite(v) for v in logged.values())
