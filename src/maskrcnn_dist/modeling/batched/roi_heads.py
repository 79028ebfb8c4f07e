"""torchvision's RoIHeads whose training forward runs on the whole batch at once.

Training: the proposals of every image (padded rows allowed, boxes.PAD) and the ground truth are
stacked; matching, labels and sampling are masks over (B, N) candidates (matcher.py, sampler.py);
the box head and the mask head run on `Rows` (rows.py), pooled by one multi-level pass (pooler.py);
the mask targets come from one roi_align (mask_targets.py) and the losses are masked (losses.py).
Each piece equals torchvision's on the same sampled set. Evaluation (and keypoint heads) run
torchvision's own forward: detections stay torchvision's, to the bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torchvision.models.detection.roi_heads import RoIHeads

from .boxes import encode, is_real, pad_rows, padded_targets, stand_in
from .losses import fastrcnn_loss, mask_loss
from .mask_targets import project_masks
from .matcher import BELOW_LOW_THRESHOLD, BETWEEN_THRESHOLDS, match, quality_matrix
from .pooler import pool
from .rows import Rows, compact_rows, padded_rows
from .sampler import sample


@dataclass(frozen=True)
class Samples:
    """The (B, N) candidates of a step (proposals, then ground truth) and what sampling made of them:
    each one's matched ground-truth index and label, the sampled positives and all sampled."""

    candidates: Tensor  # (B, N, 4)
    gt_boxes: Tensor  # (B, G, 4), padded
    matched: Tensor
    labels: Tensor
    positive: Tensor
    sampled: Tensor


class BatchedRoIHeads(RoIHeads):
    """RoIHeads (same modules and settings); its training forward batched over the images.
    `rows`: "compact" (one host read a step, exactly torchvision's rows) or "padded" (none)."""

    rows = "compact"

    def forward(
        self,
        features: dict[str, Tensor],
        proposals: list[Tensor],
        image_shapes: list[tuple[int, int]],
        targets: list[dict[str, Tensor]] | None = None,
    ) -> tuple[list[dict[str, Tensor]], dict[str, Tensor]]:
        if not self.training or self.has_keypoint():
            return super().forward(features, proposals, image_shapes, targets)
        self.check_targets(targets)
        for t in targets:
            if t["boxes"].dtype not in (torch.float, torch.double, torch.half):
                raise TypeError(f"target boxes must of float type, instead got {t['boxes'].dtype}")
            if t["labels"].dtype != torch.int64:
                raise TypeError(f"target labels must of int64 type, instead got {t['labels'].dtype}")
        samples = self.sample_candidates(proposals, targets)
        box_rows, mask_rows = self.layout(samples.sampled, samples.positive)
        losses = self.box_losses(features, image_shapes, box_rows, samples)
        if self.has_mask():
            masks = [t["masks"] for t in targets]
            losses["loss_mask"] = self.mask_losses(features, image_shapes, mask_rows, samples, masks)
        return [], losses

    def sample_candidates(self, proposals: list[Tensor], targets: list[dict[str, Tensor]]) -> Samples:
        """select_training_samples as masks over the (B, N) candidates."""
        dtype = proposals[0].dtype
        gt_boxes, gt_labels, gt_valid = padded_targets(targets, dtype)
        stacked = pad_rows(list(proposals), float("nan"))
        candidates = torch.cat((stacked, gt_boxes), dim=1)
        real = torch.cat((is_real(stacked), gt_valid), dim=1)
        matches = match(self.proposal_matcher, quality_matrix(gt_boxes, gt_valid, candidates), gt_valid)
        matched = matches.clamp(min=0)
        labels = gt_labels.gather(1, matched)
        labels = torch.where(matches == BELOW_LOW_THRESHOLD, 0, labels)
        labels = torch.where((matches == BETWEEN_THRESHOLDS) | ~real, -1, labels)
        sampler = self.fg_bg_sampler
        positive, negative = sample(labels, sampler.batch_size_per_image, sampler.positive_fraction)
        return Samples(candidates, gt_boxes, matched, labels, positive, positive | negative)

    def layout(self, sampled: Tensor, positive: Tensor) -> tuple[Rows, Rows]:
        """The box head's rows (the sampled candidates) and the mask head's (their positives)."""
        if self.rows == "padded":
            heads = (self.box_head, self.mask_head) if self.has_mask() else (self.box_head,)
            if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for head in heads for m in head.modules()):
                # Its batch statistics would take in the padding rows: not torchvision's training.
                raise ValueError("padded rows need heads without BatchNorm (maskrcnn_resnet50_fpn_v2's have it)")
            sampler = self.fg_bg_sampler
            most_positive = int(sampler.batch_size_per_image * sampler.positive_fraction)
            return padded_rows(sampled, sampler.batch_size_per_image), padded_rows(positive, most_positive)
        n_sampled, n_positive = torch.stack((sampled.sum(), positive.sum())).tolist()  # the step's one read
        return compact_rows(sampled, n_sampled), compact_rows(positive, n_positive)

    def box_losses(
        self, features: dict[str, Tensor], image_shapes: list[tuple[int, int]], rows: Rows, samples: Samples
    ) -> dict[str, Tensor]:
        boxes = stand_in(rows.take(samples.candidates), rows.real)
        pooled = pool(self.box_roi_pool, features, boxes, rows.images, rows.real, image_shapes)
        class_logits, box_regression = self.box_predictor(self.box_head(pooled))
        references = samples.gt_boxes[rows.images, rows.take(samples.matched)]
        targets = encode(references, boxes, self.box_coder.weights)
        labels = rows.take(samples.labels)
        classification, regression = fastrcnn_loss(class_logits, box_regression, labels, targets, rows.real)
        return {"loss_classifier": classification, "loss_box_reg": regression}

    def mask_losses(
        self,
        features: dict[str, Tensor],
        image_shapes: list[tuple[int, int]],
        rows: Rows,
        samples: Samples,
        masks: list[Tensor],
    ) -> Tensor:
        boxes = stand_in(rows.take(samples.candidates), rows.real)
        pooled = pool(self.mask_roi_pool, features, boxes, rows.images, rows.real, image_shapes)
        mask_logits = self.mask_predictor(self.mask_head(pooled))
        mask_targets = project_masks(masks, boxes, rows.images, rows.take(samples.matched), mask_logits.shape[-1])
        return mask_loss(mask_logits, rows.take(samples.labels), mask_targets, rows.real)
