"""RoIAlign on CPU as a sparse matrix product: the same numbers as torchvision's kernel, 5-7x faster.

Why. torchvision's CPU RoIAlign is a scalar loop on one thread; its backward scatters every
sample into an NCHW gradient. For Mask R-CNN R50-FPN at 800 px it took ~15% of a bf16 training
step on 2 cores (benchmarks/bench_roi_align.py has the figures per head).

How. Each output cell of RoIAlign (aligned=False, a fixed sampling ratio) is a weighted sum of
4 * sampling_ratio**2 feature-map pixels: the bilinear corners of its sample points, each weight
divided by the number of samples. Those weights form a sparse matrix S with one row per output
cell and one column per feature pixel, so with the features as rows of channels
(N*H*W, C) -- a free view of a channels_last map --

    pooled = S @ features        and        grad_features = S^T @ grad_pooled.

Both products run in MKL's sparse kernels on every intra-op thread, with C contiguous channels
per row. The weights follow torchvision's kernel exactly (coordinates, clamping at the border,
samples beyond one pixel outside the map contributing zero); only the order of the additions
differs, so results agree to float rounding (tests/trainer/test_roi_align.py).

The computation is in fp32 whatever the features' dtype (under --amp the features are bf16):
RoI ops are on the list of what keeps full precision. The result returns in the features' dtype,
as torchvision's own autocast kernel does. In eval mode, on CUDA, and for an adaptive sampling
ratio (`sampling_ratio <= 0`, a different number of samples per RoI), torchvision's kernels run.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torchvision.ops import MultiScaleRoIAlign
from torchvision.ops.poolers import _convert_to_roi_format, _filter_input, _setup_scales

# The poolers of torchvision's RoIHeads that are swapped for the sparse kind.
ROI_POOLERS = ("box_roi_pool", "mask_roi_pool", "keypoint_roi_pool")


def _csr(crow: Tensor, columns: Tensor, values: Tensor, shape: tuple[int, int]) -> Tensor:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")
        # Built here with sorted rows and in-range columns: no need to pay for torch's checks.
        return torch.sparse_csr_tensor(crow, columns, values, shape, check_invariants=False)


def transpose_csr(matrix: Tensor) -> Tensor:
    """The transpose of a CSR matrix, as CSR (what the backward multiplies by). Every size comes from
    the host (the number of entries is the values' length): nothing waits for the device."""
    n_rows, n_columns = matrix.shape
    crow, columns, values = matrix.crow_indices(), matrix.col_indices(), matrix.values()
    rows = torch.repeat_interleave(torch.arange(n_rows, device=crow.device), crow.diff(), output_size=values.shape[0])
    order = torch.argsort(columns, stable=True)
    per_column = torch.zeros(n_columns + 1, dtype=crow.dtype, device=crow.device)
    per_column.index_add_(0, columns + 1, torch.ones_like(columns, dtype=crow.dtype))
    return _csr(torch.cumsum(per_column, 0), rows[order], values[order], (n_columns, n_rows))


class _SparseRowsProduct(torch.autograd.Function):
    """`matrix @ rows`; the backward multiplies by the transpose, built only when a gradient is
    asked for (evaluation never pays for it)."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, rows: Tensor, matrix: Tensor) -> Tensor:
        ctx.matrix = matrix  # a constant of the graph, not an input needing a gradient
        return matrix @ rows

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: Tensor) -> tuple[Tensor, None]:
        return transpose_csr(ctx.matrix) @ grad.contiguous(), None


def _axis_corners(coord: Tensor, size: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """torchvision's bilinear_interpolate along one axis of maps `size` (K, 1, 1) pixels long: low and
    high pixel, their weights, and whether the sample lies within one pixel of the map (outside that
    it contributes zero)."""
    inside = (coord >= -1.0) & (coord <= size)
    coord = coord.clamp(min=0.0)
    low = coord.long()  # truncation, as the kernel's (int) cast; coord >= 0 here
    at_edge = low >= size - 1
    low = torch.minimum(low, size - 1)
    high = torch.where(at_edge, low, low + 1)
    frac = torch.where(at_edge, torch.zeros_like(coord), coord - low.to(coord.dtype))
    return low, high, 1.0 - frac, frac, inside


def _sample_coords(start: Tensor, end: Tensor, pooled: int, sampling_ratio: int) -> Tensor:
    """Sample coordinates (K, pooled, sampling_ratio) along one axis, in the kernel's arithmetic:
    start + p * bin + (i + 0.5) * bin / ratio, with the RoI at least one pixel long."""
    bin_size = (end - start).clamp(min=1.0) / pooled
    cell = torch.arange(pooled, dtype=start.dtype, device=start.device)
    sample = torch.arange(sampling_ratio, dtype=start.dtype, device=start.device) + 0.5
    bin_size = bin_size[:, None, None]
    return start[:, None, None] + cell[None, :, None] * bin_size + sample[None, None, :] * bin_size / sampling_ratio


@dataclass(frozen=True)
class MapGeometry:
    """Where each RoI samples: the height, width and spatial scale of its map, and the row of the
    (pixels, channels) feature matrix where its image's map begins, as (K,) tensors; `n_pixels` is
    the matrix's row count."""

    height: Tensor
    width: Tensor
    scale: Tensor
    first_pixel: Tensor
    n_pixels: int


def one_map(rois: Tensor, feature_shape: tuple[int, int, int], spatial_scale: float) -> MapGeometry:
    """Every RoI samples one (N, H, W) map, as torchvision's roi_align."""
    n_images, height, width = feature_shape
    full = rois.new_full((rois.shape[0],), 1, dtype=torch.long)
    return MapGeometry(
        full * height,
        full * width,
        full.to(torch.float32) * spatial_scale,
        rois[:, 0].long() * (height * width),
        n_images * height * width,
    )


def sampling_matrix(
    rois: Tensor,
    feature_shape: tuple[int, int, int],
    output_size: tuple[int, int],
    spatial_scale: float,
    sampling_ratio: int,
) -> Tensor:
    """The sparse RoIAlign matrix S (K*ph*pw, N*H*W), in CSR.

    `rois` is (K, 5): image index, then x1, y1, x2, y2 in input pixels. Row k*ph*pw + i*pw + j of S
    holds the weights that make output cell (i, j) of RoI k from the rows of the (N*H*W, C) features.
    """
    return geometry_matrix(rois, one_map(rois, feature_shape, spatial_scale), output_size, sampling_ratio)


def geometry_matrix(rois: Tensor, maps: MapGeometry, output_size: tuple[int, int], sampling_ratio: int) -> Tensor:
    """`sampling_matrix` for RoIs that each sample a map of their own geometry (FPN levels: one product
    pools every level); nothing is read back to the host."""
    pooled_h, pooled_w = output_size
    n_rois = rois.shape[0]
    rois = rois.float()
    x1, y1, x2, y2 = (rois[:, i] * maps.scale for i in range(1, 5))
    height, width = maps.height.view(n_rois, 1, 1), maps.width.view(n_rois, 1, 1)
    ys = _sample_coords(y1, y2, pooled_h, sampling_ratio)  # (K, ph, r)
    xs = _sample_coords(x1, x2, pooled_w, sampling_ratio)  # (K, pw, r)
    y_low, y_high, wy_low, wy_high, y_inside = _axis_corners(ys, height)
    x_low, x_high, wx_low, wx_high, x_inside = _axis_corners(xs, width)

    # Broadcast to (K, ph, pw, ry, rx): one row of S per (K, ph, pw), its entries in the last axes.
    def along_y(t: Tensor) -> Tensor:
        return t.view(n_rois, pooled_h, 1, sampling_ratio, 1)

    def along_x(t: Tensor) -> Tensor:
        return t.view(n_rois, 1, pooled_w, 1, sampling_ratio)

    samples = sampling_ratio * sampling_ratio
    weight_scale = (along_y(y_inside) & along_x(x_inside)).float() / samples
    pixel0 = maps.first_pixel.view(n_rois, 1, 1, 1, 1)
    row_width = maps.width.view(n_rois, 1, 1, 1, 1)
    columns, weights = [], []
    for y_index, y_weight in ((y_low, wy_low), (y_high, wy_high)):
        for x_index, x_weight in ((x_low, wx_low), (x_high, wx_high)):
            columns.append(pixel0 + along_y(y_index) * row_width + along_x(x_index))
            weights.append(along_y(y_weight) * along_x(x_weight) * weight_scale)
    # (K, ph, pw, ry, rx, corner) flattened: the entries of each row are contiguous.
    columns_t = torch.stack(columns, dim=-1).reshape(-1)
    weights_t = torch.stack(weights, dim=-1).reshape(-1)
    n_rows = n_rois * pooled_h * pooled_w
    per_row = 4 * samples
    crow = torch.arange(0, n_rows * per_row + 1, per_row, device=rois.device)
    return _csr(crow, columns_t, weights_t, (n_rows, maps.n_pixels))


def feature_rows(maps: list[Tensor]) -> Tensor:
    """The (N, C, H, W) maps as one (sum of N*H*W, C) fp32 matrix, map after map: a view of one
    channels_last map, a copy otherwise (or the fp32 cast under amp)."""
    with torch.autocast(maps[0].device.type, enabled=False):
        rows = [m.permute(0, 2, 3, 1).reshape(-1, m.shape[1]).float() for m in maps]
    return rows[0] if len(rows) == 1 else torch.cat(rows)


def pool_rows(rows: Tensor, matrix: Tensor, n_rois: int, output_size: tuple[int, int], dtype: torch.dtype) -> Tensor:
    """`matrix @ rows` (with its backward) as (K, C, ph, pw) pooled features of `dtype`."""
    with torch.autocast(rows.device.type, enabled=False):
        pooled = _SparseRowsProduct.apply(rows, matrix)
    pooled = pooled.view(n_rois, output_size[0], output_size[1], rows.shape[1]).permute(0, 3, 1, 2)
    return pooled.contiguous().to(dtype)


def sparse_roi_align(
    features: Tensor, rois: Tensor, output_size: tuple[int, int], spatial_scale: float, sampling_ratio: int
) -> Tensor:
    """`torchvision.ops.roi_align(features, rois, output_size, spatial_scale, sampling_ratio,
    aligned=False)` for CPU tensors and `sampling_ratio > 0`, computed as a sparse product."""
    if sampling_ratio <= 0:
        raise ValueError(f"sparse_roi_align needs a fixed sampling_ratio > 0, got {sampling_ratio}")
    n_images, _, height, width = features.shape
    matrix = sampling_matrix(rois.detach(), (n_images, height, width), output_size, spatial_scale, sampling_ratio)
    return pool_rows(feature_rows([features]), matrix, rois.shape[0], output_size, features.dtype)


class SparseMultiScaleRoIAlign(MultiScaleRoIAlign):
    """torchvision's MultiScaleRoIAlign (same levels, scales and output), pooling each level with
    `sparse_roi_align` on CPU in training mode. In eval mode (evaluation, predict, the gallery), on
    other devices, or with an adaptive sampling ratio, it is torchvision's: a checkpoint's detections
    are then torchvision's own to the bit (docs/predict-and-report.md), at the cost of the forward
    pooling only; the backward, where the sparse product gains most, exists in training alone."""

    def forward(self, x: dict[str, Tensor], boxes: list[Tensor], image_shapes: list[tuple[int, int]]) -> Tensor:
        features = _filter_input(x, self.featmap_names)
        if not self.training or features[0].device.type != "cpu" or self.sampling_ratio <= 0:
            return super().forward(x, boxes, image_shapes)
        if self.scales is None or self.map_levels is None:
            self.scales, self.map_levels = _setup_scales(
                features, image_shapes, self.canonical_scale, self.canonical_level
            )
        rois = _convert_to_roi_format(boxes)
        if len(features) == 1:
            return sparse_roi_align(features[0], rois, self.output_size, self.scales[0], self.sampling_ratio)
        levels = self.map_levels(boxes)
        result = features[0].new_zeros((rois.shape[0], features[0].shape[1], *self.output_size))
        for level, (feature, scale) in enumerate(zip(features, self.scales)):
            in_level = torch.where(levels == level)[0]
            if in_level.numel():
                pooled = sparse_roi_align(feature, rois[in_level], self.output_size, scale, self.sampling_ratio)
                result[in_level] = pooled.to(result.dtype)
        return result


def use_sparse_roi_align(roi_heads: nn.Module) -> list[str]:
    """Swap the RoI heads' MultiScaleRoIAlign poolers for `SparseMultiScaleRoIAlign` (they hold no
    parameters: state dicts are unchanged); returns the names swapped."""
    swapped = []
    for name in ROI_POOLERS:
        pooler = getattr(roi_heads, name, None)
        if type(pooler) is MultiScaleRoIAlign:
            sparse = SparseMultiScaleRoIAlign(
                pooler.featmap_names,
                pooler.output_size,
                pooler.sampling_ratio,
                canonical_scale=pooler.canonical_scale,
                canonical_level=pooler.canonical_level,
            )
            setattr(roi_heads, name, sparse)
            swapped.append(name)
    return swapped
