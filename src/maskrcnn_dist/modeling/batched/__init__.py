"""Mask R-CNN's training forward batched over the batch's images with fixed-size tensors (--heads batched).

torchvision's RPN and RoI heads train image by image and ask the device for data-dependent sizes
(`nonzero`, boolean indexing, per-image NMS, `.item()`): about 15 host waits per image a step. Here
the same modules run their training forward on the whole batch, as MLPerf's Mask R-CNN does, with a
few host waits a step whatever the batch size (docs/performance.md has the counts):

- `boxes.py`: box arithmetic on padded batches, torchvision's to the bit, and the padding convention;
- `nms.py`: NMS for every image and level at once, with fixed-size outputs (one read to settle);
- `proposals.py`: the RPN's proposal filter as masks around that NMS;
- `matcher.py`, `sampler.py`: the Matcher and the balanced sampler as masks (topk of random keys);
- `rows.py`: the rows the RoI heads compute, compact (one read) or padded (none);
- `pooler.py`, `mask_targets.py`: multi-level RoIAlign in one pass, mask targets in one roi_align;
- `losses.py`: the four heads' losses over masked rows;
- `rpn.py`, `roi_heads.py`, `model.py`: the modules, and `use_batched_heads`, which installs them.

Invariant: parameters, state-dict keys and evaluation are torchvision's; every deterministic piece
equals torchvision's on the same inputs (tests/trainer/batched/).
"""

from .model import use_batched_heads

__all__ = ["use_batched_heads"]
