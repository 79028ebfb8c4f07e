"""torchvision's RegionProposalNetwork whose training forward runs on the whole batch at once.

Training: the anchors are the same for every image of a padded batch, so the decoded proposals, the
anchor matching (matcher.py, low-quality matches included), the sampler (sampler.py) and the losses
(losses.py) are (B, A) tensors; the proposals are chosen by proposals.py and returned as torchvision
returns them, a list of (P, 4) tensors, one per image, their unfilled rows boxes.PAD. Evaluation runs
torchvision's own forward.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchvision.models.detection.image_list import ImageList
from torchvision.models.detection.rpn import RegionProposalNetwork, concat_box_prediction_layers

from .boxes import decode, encode, padded_targets
from .losses import rpn_loss
from .matcher import BETWEEN_THRESHOLDS, match, quality_matrix
from .nms import Settling
from .proposals import ProposalFilter, select_proposals
from .sampler import sample


class BatchedRPN(RegionProposalNetwork):
    """RegionProposalNetwork (same modules and settings); its training forward batched over images."""

    def forward(
        self,
        images: ImageList,
        features: dict[str, Tensor],
        targets: list[dict[str, Tensor]] | None = None,
    ) -> tuple[list[Tensor], dict[str, Tensor]]:
        if not self.training:
            return super().forward(images, features, targets)
        if targets is None:
            raise ValueError("targets should not be None")
        maps = list(features.values())
        objectness, deltas = self.head(maps)
        # One padded canvas: every image has the same anchors.
        anchors = self.anchor_generator(images, maps)[0]
        per_level = [o[0].numel() for o in objectness]
        logits, deltas = concat_box_prediction_layers(objectness, deltas)
        batch = len(images.image_sizes)
        every_anchor = anchors.repeat(batch, 1)
        decoded = decode(deltas.detach(), every_anchor, self.box_coder.weights).view(batch, -1, 4)
        logits = logits.view(batch, -1)
        settling = self.__dict__.setdefault("_nms_settling", Settling())  # host state, carried from step to step
        proposals = select_proposals(
            decoded, logits.detach(), images.image_sizes, per_level, self.proposal_filter(), settling
        )
        labels, matched_boxes = self.anchor_targets(anchors, targets)
        regression_targets = encode(matched_boxes.view(-1, 4), every_anchor, self.box_coder.weights)
        sampler = self.fg_bg_sampler
        positive, negative = sample(labels, sampler.batch_size_per_image, sampler.positive_fraction)
        loss_objectness, loss_rpn_box_reg = rpn_loss(
            logits,
            deltas.view(batch, -1, 4),
            labels,
            regression_targets.view(batch, -1, 4),
            positive,
            negative,
        )
        return list(proposals.unbind(0)), {"loss_objectness": loss_objectness, "loss_rpn_box_reg": loss_rpn_box_reg}

    def proposal_filter(self) -> ProposalFilter:
        return ProposalFilter(
            self.pre_nms_top_n(), self.post_nms_top_n(), self.nms_thresh, self.score_thresh, self.min_size
        )

    def anchor_targets(self, anchors: Tensor, targets: list[dict[str, Tensor]]) -> tuple[Tensor, Tensor]:
        """assign_targets_to_anchors for the batch: (B, A) labels (1 object, 0 background, -1 between the
        thresholds) and each anchor's matched box (B, A, 4)."""
        gt_boxes, _, gt_valid = padded_targets(targets, anchors.dtype)
        every = anchors[None].expand(len(targets), -1, -1)
        matches = match(self.proposal_matcher, quality_matrix(gt_boxes, gt_valid, every), gt_valid)
        matched_boxes = gt_boxes.gather(1, matches.clamp(min=0)[..., None].expand(-1, -1, 4))
        labels = (matches >= 0).to(torch.float32)
        labels = torch.where(matches == BETWEEN_THRESHOLDS, -1.0, labels)
        return labels, matched_boxes
