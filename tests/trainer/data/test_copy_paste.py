"""--use-copypaste: the references' SimpleCopyPaste by its properties, batch level and deterministic."""

from __future__ import annotations

import pytest
import torch
from torchvision.transforms.v2 import functional as F

from maskrcnn_dist.config import TrainConfig, apply_overrides
from maskrcnn_dist.data.transforms.copy_paste import CopyPaste, blend_weights, copy_paste
from maskrcnn_dist.errors import ConfigError

from .test_augment import sample


def batch(seeds=range(4), size: int = 64, objects: int = 4):
    """Images of one size (as lsj leaves them), each with its objects; image ids are the seeds, and each
    image's labels its own (10 i + 1, ...), so that where a pasted object came from shows."""
    samples = [sample(seed, size, size, objects) for seed in seeds]
    return [(image, {**target, "labels": target["labels"] + 10 * i}) for i, (image, target) in enumerate(samples)]


def pasted_count(seed: int, count: int) -> int:
    """How many objects the references' draw picks with this generator seed: `count` picks, each kept once."""
    return len(torch.unique(torch.randint(0, count, (count,), generator=torch.Generator().manual_seed(seed))))


def test_pasted_objects_occlude_what_lies_under_them():
    for seed in range(10):
        (image, target), (source, source_target) = batch([seed, seed + 100])
        out_image, out = copy_paste(image, target, source, source_target, torch.Generator().manual_seed(seed))
        pasted = pasted_count(seed, len(source_target["masks"]))
        own, pasted_masks = out["masks"][:-pasted], out["masks"][-pasted:]
        covered = pasted_masks.bool().any(0)
        assert not (own.bool() & covered).any()  # the image's own objects lose what is pasted over them

        # Away from the blended edge (the 5 x 5 blur reaches 2 pixels) the pixels are the source's.
        def near(mask):  # within the blur's 5 x 5 window of `mask`
            return torch.nn.functional.max_pool2d(mask[None].float(), 5, stride=1, padding=2)[0].bool()

        inside, outside = ~near(~covered), ~near(covered)
        assert inside.any() and outside.any()
        torch.testing.assert_close(out_image[:, inside], source[:, inside], rtol=0, atol=1e-5)
        torch.testing.assert_close(out_image[:, outside], image[:, outside], rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "region", [(slice(20, 30), slice(30, 44)), (slice(0, 5), slice(0, 64)), (slice(60, 64), slice(61, 64))]
)
def test_blending_weights_are_the_whole_images_blur(region):
    """Blurring around the pasted pixels only gives the references' blur of the whole image, at its
    borders too (the blur reflects there)."""
    covered = torch.zeros(64, 64, dtype=torch.bool)
    covered[region] = True
    covered[40:42, 3:5] = True
    whole = F.gaussian_blur(covered[None].float(), [5, 5], [2.0])[0]
    torch.testing.assert_close(blend_weights(covered), whole, rtol=0, atol=1e-6)


def test_every_kept_object_has_pixels_and_a_box_that_bounds_them():
    for seed in range(20):
        (image, target), (source, source_target) = batch([seed, seed + 50], objects=6)
        out_image, out = copy_paste(image, target, source, source_target, torch.Generator().manual_seed(seed))
        assert out_image.shape == image.shape and out["masks"].shape[-2:] == image.shape[-2:]
        n = len(out["masks"])
        assert len(out["boxes"]) == len(out["labels"]) == len(out["area"]) == len(out["iscrowd"]) == n
        for box, mask in zip(out["boxes"], out["masks"], strict=True):
            ys, xs = torch.nonzero(mask, as_tuple=True)
            assert len(xs) > 0  # no empty object kept
            assert box.tolist() == [xs.min().item(), ys.min().item(), xs.max().item() + 1, ys.max().item() + 1]
        assert torch.equal(out["area"], out["masks"].flatten(1).sum(1).float())


def test_an_object_pasted_over_entirely_is_dropped_and_nothing_to_paste_changes_nothing():
    (image, target), (source, source_target) = batch([1, 2], objects=1)
    source_target = {**source_target, "masks": torch.ones_like(source_target["masks"])}
    source_target["boxes"] = torch.tensor([[0.0, 0.0, 64.0, 64.0]])
    _, out = copy_paste(image, target, source, source_target, torch.Generator().manual_seed(0))
    assert out["labels"].tolist() == source_target["labels"].tolist()  # only the pasted object is left
    empty = {**source_target, "masks": source_target["masks"][:0], "boxes": source_target["boxes"][:0]}
    empty["labels"] = source_target["labels"][:0]
    same_image, same = copy_paste(image, target, source, empty, torch.Generator().manual_seed(0))
    assert same_image is image and same is target


def test_each_image_receives_from_the_one_before_it_deterministically():
    samples = batch()
    rng = torch.get_rng_state()
    images, targets = CopyPaste(seed=3, epoch=1)(samples)
    assert torch.equal(torch.get_rng_state(), rng)
    again_images, again = CopyPaste(seed=3, epoch=1)(samples)
    assert all(torch.equal(a, b) for a, b in zip(images, again_images, strict=True))
    for i, target in enumerate(targets):
        source_labels = set(samples[i - 1][1]["labels"].tolist())
        own = len(target["labels"]) - len(set(target["labels"].tolist()) & source_labels)
        assert own < len(target["labels"])  # something was pasted, from image i - 1 (the batch rolled by one)
        assert set(target["labels"][own:].tolist()) <= source_labels
        assert set(target["labels"][:own].tolist()) <= set(samples[i][1]["labels"].tolist())
    other_epochs = [CopyPaste(seed=3, epoch=e)(samples)[1] for e in (2, 3, 4)]
    assert any([len(t["labels"]) for t in other] != [len(t["labels"]) for t in targets] for other in other_epochs)


def test_copy_paste_needs_lsj():
    with pytest.raises(ConfigError, match="--use-copypaste needs --data-augmentation lsj"):
        apply_overrides(TrainConfig(), {"use-copypaste": True, "data-augmentation": "multiscale"}, "test").validate()
    apply_overrides(TrainConfig(), {"use-copypaste": True, "data-augmentation": "lsj"}, "test").validate()
