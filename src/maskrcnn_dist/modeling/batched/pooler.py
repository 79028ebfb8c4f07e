"""MultiScaleRoIAlign for fixed-size sets of RoIs: every level in one pass, no `where(levels == l)`.

torchvision's pooler finds each level's RoIs with `torch.where(levels == level)` (a data-dependent
length, so a host wait per level and per head). Here each RoI keeps its row:
- on a CPU (training, fixed sampling ratio): one sparse product pools every level at once: the
  sampling matrix (roi_align.py) gives each RoI the geometry of its own level, its columns index the
  levels' feature maps stacked into one matrix; the same numbers as torchvision's kernel, per level;
- elsewhere: torchvision's kernel pools all RoIs on every level, and each RoI takes its own level's
  result (a select, not an index): more arithmetic, no shape that depends on the data.
The level of a RoI, the scales and the output are the pooler's own (its LevelMapper and
`_setup_scales`), so the pooled features equal torchvision's.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchvision.ops import MultiScaleRoIAlign, roi_align
from torchvision.ops.poolers import _filter_input, _setup_scales

from ..roi_align import MapGeometry, feature_rows, geometry_matrix, pool_rows
from .boxes import from_host, stand_in


def pool(
    pooler: MultiScaleRoIAlign,
    features: dict[str, Tensor],
    boxes: Tensor,
    images: Tensor,
    real: Tensor,
    image_shapes: list[tuple[int, int]],
    sparse: bool | None = None,
) -> Tensor:
    """(R, C, ph, pw) features of R boxes (R, 4), each of image `images` (R,); rows not `real` are
    padding (pooled from a stand-in box, for the caller to ignore). `sparse`: the one product (default:
    on a CPU with a fixed sampling ratio) or torchvision's kernel on every level."""
    maps = _filter_input(features, pooler.featmap_names)
    if pooler.scales is None or pooler.map_levels is None:
        pooler.scales, pooler.map_levels = _setup_scales(
            maps, image_shapes, pooler.canonical_scale, pooler.canonical_level
        )
    boxes = stand_in(boxes, real)
    rois = torch.cat((images[:, None].to(boxes.dtype), boxes), dim=1).detach()
    if len(maps) == 1:
        levels = torch.zeros_like(images)
    else:
        levels = pooler.map_levels([boxes])
    if sparse is None:
        sparse = maps[0].device.type == "cpu" and pooler.sampling_ratio > 0
    if sparse:
        matrix = geometry_matrix(
            rois, level_geometry(maps, pooler.scales, levels, images), pooler.output_size, pooler.sampling_ratio
        )
        return pool_rows(feature_rows(maps), matrix, rois.shape[0], pooler.output_size, maps[0].dtype)
    result = None
    for level, (feature, scale) in enumerate(zip(maps, pooler.scales)):
        pooled = roi_align(feature, rois, pooler.output_size, scale, pooler.sampling_ratio)
        result = pooled if result is None else torch.where((levels == level)[:, None, None, None], pooled, result)
    return result


def level_geometry(maps: list[Tensor], scales: list[float], levels: Tensor, images: Tensor) -> MapGeometry:
    """Each RoI's map: its level's height, width and scale, and where its image's map begins among the
    levels' maps stacked as rows (level after level, image after image)."""
    sizes = [(m.shape[0], m.shape[2], m.shape[3]) for m in maps]
    starts, start = [], 0
    for n, h, w in sizes:
        starts.append(start)
        start += n * h * w
    table = from_host([[h, w, s0] for (_, h, w), s0 in zip(sizes, starts)], levels, torch.long)[levels]
    scale = from_host(scales, levels, torch.float32)[levels]
    return MapGeometry(table[:, 0], table[:, 1], scale, table[:, 2] + images * table[:, 0] * table[:, 1], start)
