"""The eager model's image resize, reproduced exactly in TorchScript and ONNX graphs.

Why. torchvision resizes an image by the factor s = min(min_size / short side, max_size / long side),
to floor(side * s) pixels. Eagerly s is a Python float (double). The scripted model computes s in
float32 and takes `.item()`; the ONNX trace computes it in float32 too: the side that s should bring to
exactly min_size or max_size then often lands one pixel short (94 * float32(96 / 94) < 95.999...). A
one-pixel smaller image moves every box and mask a little and, on a model whose scores are close,
changes which detections survive: the export's parity check failed on such images, for both formats.

How. Here s and the output size are computed in float64 from the image's shape, as 1-D tensors (the
TorchScript-based ONNX exporter demotes 0-d doubles to float32), and the image is resized to that size
(ONNX: Resize with sizes). Inference only: exported models take no targets.
"""

import torch
from torch import Tensor
from torchvision.models.detection import MaskRCNN
from torchvision.models.detection.transform import GeneralizedRCNNTransform


class ExactResizeTransform(GeneralizedRCNNTransform):
    """GeneralizedRCNNTransform whose eval-mode resize gives the eager sizes in every graph."""

    def resize(
        self,
        image: Tensor,
        target: dict[str, Tensor] | None = None,
    ) -> tuple[Tensor, dict[str, Tensor] | None]:
        sides = torch._shape_as_tensor(image)[-2:].to(torch.float64)
        limits = torch.tensor([float(self.min_size[-1]), float(self.max_size)], dtype=torch.float64)
        scale = torch.min(limits / torch.sort(sides).values, dim=0, keepdim=True).values
        size = torch.floor(sides * scale).to(torch.int64)
        if torch.jit.is_scripting():
            fixed: list[int] = [int(size[0]), int(size[1])]
            resized = torch.nn.functional.interpolate(image[None], size=fixed, mode="bilinear", align_corners=False)
        else:  # eager and traced: the sizes stay tensors, so the ONNX graph computes them per image
            resized = torch.nn.functional.interpolate(
                image[None], size=[size[0], size[1]], mode="bilinear", align_corners=False
            )
        return resized[0], target


def use_exact_resize(model: MaskRCNN) -> None:
    """Swap the model's transform for ExactResizeTransform (same sizes, mean and std; no parameters)."""
    old = model.transform
    model.transform = ExactResizeTransform(
        old.min_size, old.max_size, old.image_mean, old.image_std, old.size_divisible, old.fixed_size
    )
