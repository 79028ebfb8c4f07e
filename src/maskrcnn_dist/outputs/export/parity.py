"""The parity check of an export: the exported and the eager model's detections on the same images,
compared under stated tolerances.

Detections are matched per image, in the eager model's score order: each eager detection takes the
unmatched exported detection of the same label with the highest box IoU, if that IoU is at least
`match_iou`. Matched pairs must agree within `box_px` pixels in every box coordinate, `score` in score,
and their masks (thresholded at 0.5, as evaluation and predict do) with an IoU of at least `mask_iou`,
the pixels of all pairs of an image pooled. Pooled, because a mask is pasted into its box rounded to
whole pixels: a box within `box_px` can move a mask by a pixel, which leaves a large mask's IoU near 1
but a mask of a box one or two pixels thin (an untrained model finds many) anywhere from 0 to 1; a wrong
mask head or resize, what the check is for, moves every mask.

A detection without a partner is a difference, unless it sits at the model's cut: the detections
below the score threshold (roi_heads.score_thresh) are dropped and at most detections_per_img are kept,
so a detection scoring within `score` of where the other model cut may fall on either side of it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torchvision.ops import box_iou

Detection = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Tolerances:
    match_iou: float = 0.5  # a pair: same label, box IoU at least this
    box_px: float = 0.5  # max |difference| of a matched pair's box coordinates, pixels
    score: float = 1e-3  # max |difference| of a matched pair's scores
    mask_iou: float = 0.95  # min IoU of the matched pairs' binary masks, pixels pooled per image


TOLERANCES = Tolerances()


@dataclass(frozen=True)
class Cut:
    """Where the model drops detections: below `score_thresh`, and beyond `per_image` per image."""

    score_thresh: float
    per_image: int

    def of(self, detection: Detection) -> float:
        """The lowest score that made it into `detection`'s list, or could have."""
        scores = detection["scores"]
        return float(scores.min()) if len(scores) >= self.per_image else self.score_thresh


@dataclass
class ImageParity:
    """One image's comparison: counts, the largest differences, and what exceeds the tolerances."""

    name: str
    size: tuple[int, int]  # height, width
    eager: int
    exported: int
    matched: int
    box_diff: float = 0.0
    score_diff: float = 0.0
    mask_iou: float = 1.0
    # (message, what, how far beyond its tolerance): the largest excess is the image's worst problem
    problems: list[tuple[str, str, float]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def worst(self) -> tuple[str, str, float]:
        return max(self.problems, key=lambda problem: problem[2])


def _pooled_mask_iou(a: torch.Tensor, b: torch.Tensor) -> float:
    """IoU of the pairs' binary masks [N, H, W], their pixels pooled over all pairs."""
    union = int((a | b).sum())
    return 1.0 if union == 0 else int((a & b).sum()) / union


def _match(eager: Detection, exported: Detection, match_iou: float) -> list[tuple[int, int]]:
    """(eager index, exported index) pairs, greedily in the eager model's score order."""
    if not len(eager["boxes"]) or not len(exported["boxes"]):
        return []
    ious = box_iou(eager["boxes"].double(), exported["boxes"].double())
    ious[eager["labels"][:, None] != exported["labels"][None, :]] = -1.0
    pairs = []
    for i in torch.argsort(eager["scores"], descending=True).tolist():
        best, j = ious[i].max(0)
        if float(best) >= match_iou:
            pairs.append((i, int(j)))
            ious[:, j] = -1.0  # taken
    return pairs


def compare(
    name: str,
    size: tuple[int, int],
    eager: Detection,
    exported: Detection,
    cut: Cut,
    tolerances: Tolerances = TOLERANCES,
) -> ImageParity:
    """One image's (`size`: height, width) detections by the eager and by the exported model, compared."""
    pairs = _match(eager, exported, tolerances.match_iou)
    result = ImageParity(name, size, len(eager["boxes"]), len(exported["boxes"]), len(pairs))
    if pairs:
        mine, theirs = (torch.tensor(index) for index in zip(*pairs))
        result.box_diff = _max_abs_diff(eager["boxes"][mine], exported["boxes"][theirs])
        result.score_diff = _max_abs_diff(eager["scores"][mine], exported["scores"][theirs])
        result.mask_iou = _pooled_mask_iou(eager["masks"][mine, 0] > 0.5, exported["masks"][theirs, 0] > 0.5)
    limits = (
        ("box difference px", result.box_diff, tolerances.box_px),
        ("score difference", result.score_diff, tolerances.score),
        ("mask IoU shortfall", 1 - result.mask_iou, 1 - tolerances.mask_iou),
    )
    for what, value, limit in limits:
        if not value <= limit:  # NaN fails too
            shown = f"mask IoU {result.mask_iou:.4f} < {tolerances.mask_iou:g}" if "mask" in what else None
            result.problems.append((shown or f"{what} {value:.4g} > {limit:g}", what, _excess(value, limit)))
    for side, detection, other, taken in (
        ("eager", eager, exported, {i for i, _ in pairs}),
        ("exported", exported, eager, {j for _, j in pairs}),
    ):
        limit = cut.of(other) + tolerances.score
        missing = [float(s) for k, s in enumerate(detection["scores"]) if k not in taken and float(s) > limit]
        if missing:
            result.problems.append(
                (
                    f"{len(missing)} {side} detection(s) without a partner, scoring up to {max(missing):.4f} "
                    f"(the other model's cut: {limit:.4f})",
                    "unmatched",
                    1e6 + len(missing),  # a lost detection is worse than any numeric difference
                )
            )
    return result


def _max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


def _excess(value: float, limit: float) -> float:
    return math.inf if not math.isfinite(value) else value / max(limit, 1e-12)


TABLE_HEADER = ("image", "size", "eager", "exported", "matched", "max |dbox| px", "max |dscore|", "mask IoU", "")


def table_lines(results: list[ImageParity], tolerances: Tolerances = TOLERANCES) -> list[str]:
    """The parity table: one row per image, the tolerances in the last line."""
    rows = [TABLE_HEADER] + [
        (
            r.name,
            f"{r.size[1]}x{r.size[0]}",
            str(r.eager),
            str(r.exported),
            str(r.matched),
            f"{r.box_diff:.2e}",
            f"{r.score_diff:.2e}",
            f"{r.mask_iou:.4f}",
            "ok" if r.ok else "DIFFERS",
        )
        for r in results
    ]
    widths = [max(len(row[k]) for row in rows) for k in range(len(TABLE_HEADER))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    lines.append(
        f"tolerances: pairs by label and box IoU >= {tolerances.match_iou:g}; |dbox| <= {tolerances.box_px:g} px; "
        f"|dscore| <= {tolerances.score:g}; mask IoU >= {tolerances.mask_iou:g}; unmatched only at the score cut"
    )
    return lines


def worst_problem(results: list[ImageParity]) -> tuple[ImageParity, str] | None:
    """The image with the largest excess over a tolerance, and what it is; None when every image passes."""
    failing = [r for r in results if not r.ok]
    if not failing:
        return None
    image = max(failing, key=lambda r: r.worst()[2])
    return image, image.worst()[0]


def run_parity(
    names: list[str],
    images: list[torch.Tensor],
    eager: Callable[[torch.Tensor], Detection],
    exported: Callable[[torch.Tensor], Detection],
    cut: Cut,
) -> list[ImageParity]:
    """Both models on each image, one image at a time (a batch would pad images to a common size)."""
    return [
        compare(name, (image.shape[-2], image.shape[-1]), eager(image), exported(image), cut)
        for name, image in zip(names, images)
    ]
