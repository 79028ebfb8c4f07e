"""Drawing detections: colour where the masks are and nowhere else, one colour per instance, low scores
left out and an empty image noted."""

from __future__ import annotations

import torch

from maskrcnn_dist.categories import Categories
from maskrcnn_dist.outputs.draw import MASK_ALPHA, PALETTE, draw_detections
from maskrcnn_dist.outputs.predict import draw_prediction


def _grey(height: int = 80, width: int = 96) -> torch.Tensor:
    return torch.full((3, height, width), 100, dtype=torch.uint8)


def test_drawing_colours_the_mask_and_leaves_the_rest():
    image = _grey()
    mask = torch.zeros(1, 80, 96, dtype=torch.bool)
    mask[0, 40:60, 30:50] = True
    box = torch.tensor([[20.0, 30.0, 60.0, 70.0]])  # 10 px around the mask
    drawn = draw_detections(image, box, mask, ["a"], "none")  # the caption sits inside the box, top left
    colour = torch.tensor(PALETTE[0], dtype=torch.float32)[:, None, None]
    expected = (image.float() * (1 - MASK_ALPHA) + colour * MASK_ALPHA).to(torch.uint8)
    inside = mask[0]
    assert (
        drawn[:, inside].int() - expected[:, inside].int()
    ).abs().max() <= 1  # every mask pixel, blended with its colour
    between = torch.zeros(80, 96, dtype=torch.bool)
    between[46:68, 23:58] = True  # inside the box, clear of its 1 px outline and the caption
    between &= ~inside
    assert torch.equal(drawn[:, between], image[:, between])  # no colour beside the mask
    far = torch.ones(80, 96, dtype=torch.bool)
    far[15:75, 15:65] = False  # the box, its caption above it, and a margin
    assert torch.equal(drawn[:, far], image[:, far])


def test_each_instance_has_its_own_colour():
    masks = torch.zeros(2, 80, 96, dtype=torch.bool)
    masks[0, 10:30, 10:30] = True
    masks[1, 40:70, 50:90] = True
    boxes = torch.tensor([[5.0, 5.0, 35.0, 35.0], [45.0, 35.0, 95.0, 75.0]])
    drawn = draw_detections(_grey(), boxes, masks, ["a", "b"], "none")
    first, second = drawn[:, 25, 25], drawn[:, 65, 80]
    assert not torch.equal(first, second) and not torch.equal(first, _grey()[:, 0, 0])


def test_low_scores_are_not_drawn_and_an_empty_image_gets_a_note():
    image = torch.full((3, 80, 96), 0.4)
    masks = torch.zeros(1, 1, 80, 96)
    masks[0, 0, 40:60, 30:50] = 0.9
    detection = {
        "boxes": torch.tensor([[30.0, 40.0, 50.0, 60.0]]),
        "labels": torch.tensor([1]),
        "scores": torch.tensor([0.3]),
        "masks": masks,
    }
    categories = Categories.by_index(2)
    drawn = draw_prediction(image, detection, categories, threshold=0.5)
    plain = draw_prediction(image, {**detection, "scores": torch.tensor([0.0])}, categories, threshold=0.5)
    assert torch.equal(drawn, plain)
    scale = drawn.shape[-1] // 96  # small images are enlarged for legible captions
    changed = (drawn != torch.full_like(drawn, 102)).any(0)  # 0.4 * 255 rounds to 102
    rows, cols = changed.nonzero().max(0).values.tolist()
    assert changed.any() and rows < 20 and cols < drawn.shape[-1] // 2  # only the note, top left
    shown = draw_prediction(image, detection, categories, threshold=0.2)
    assert (shown[:, 45 * scale, 40 * scale] != 102).all()  # drawn once the threshold admits it
