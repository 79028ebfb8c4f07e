"""The export formats: how each one writes a model, and how the file it wrote runs (for the parity check).

Both take torchvision's own Mask R-CNN modules (model.build_model(..., exportable=True)) in eval mode,
fp32, on the CPU, and both keep dynamic image sizes: any [3, H, W] image in [0, 1], resized inside the
model to the checkpoint's --min-size/--max-size as in training.

- TorchScript: `torch.jit.script`, so every control-flow path is kept. The file is called with a list of
  images and returns torchvision's scripted pair `(losses, detections)`; loading it needs torchvision
  imported (its nms and roi_align ops). The metadata (categories) is its extra file categories.json.
- ONNX: one image per call, input `image` [3, H, W]; outputs boxes [N, 4], labels [N], scores [N],
  masks [N, 1, H, W] (probabilities; > 0.5 is the object). The metadata is a JSON file beside it.

Which ONNX exporter, and why. The current one, `torch.onnx.export(..., dynamo=True)` (the default since
torch 2.9), cannot export torchvision's detection models with torch 2.14.1 / torchvision 0.29.2, with or
without dynamic shapes: torch.export stops in the RPN's box filtering, at torchvision/ops/boxes.py:103
(`_batched_nms_coordinate_trick`: `if boxes.numel() == 0`) with "GuardOnDataDependentSymNode: Could not
guard on data-dependent expression Eq(4*u1, 0)" (how many boxes survive the score filter depends on the
image). The TorchScript-based exporter (`dynamo=False`), the one torchvision's own test/test_onnx.py
runs through onnxruntime, traces the paths torchvision writes for ONNX (`torchvision._is_tracing()`) and
keeps the image's height and width dynamic with `dynamic_axes`; it is used here, at opset 17 (RoIAlign
needs 16 or later for torchvision's half-pixel arithmetic). torch warns that it is deprecated.
"""

from __future__ import annotations

import importlib.util
import json
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...errors import UserError

Detection = dict[str, torch.Tensor]
Runner = Callable[[torch.Tensor], Detection]

METADATA_FILE = "categories.json"  # TorchScript's extra file
ONNX_OPSET = 17
ONNX_INPUT = "image"
ONNX_OUTPUTS = ("boxes", "labels", "scores", "masks")
ONNX_PACKAGES = ("onnx", "onnxruntime")


class ExportError(UserError):
    """A model that cannot be written in the asked format (a missing package, an exporter's refusal)."""


@contextmanager
def quiet() -> Iterator[None]:
    """Without the exporters' warnings: the tracer warns at every shape torchvision computes in Python,
    and both exporters at their own deprecation. Whether the file generalises to other images is what
    the parity check measures, on images of other sizes than the one traced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


class TorchScriptFormat:
    name = "torchscript"
    suffixes = (".pt", ".ts")

    def check_available(self) -> None:
        """TorchScript is part of torch."""

    def write(self, model: nn.Module, example: torch.Tensor, path: Path, metadata: dict[str, Any]) -> None:
        with quiet():
            scripted = torch.jit.script(model)
            torch.jit.save(scripted, str(path), _extra_files={METADATA_FILE: json.dumps(metadata)})

    def load(self, path: Path) -> Runner:
        with quiet():
            module = torch.jit.load(str(path), map_location="cpu")

        def run(image: torch.Tensor) -> Detection:
            with quiet(), torch.no_grad():
                _losses, detections = module([image])
            return detections[0]

        return run

    def metadata_place(self, out: Path) -> tuple[str, Path | None]:
        """Where the metadata goes: (how the command's output says it, the sidecar file or None)."""
        return f"{out.name}'s extra file {METADATA_FILE} (torch.jit.load(..., _extra_files=...))", None


class OnnxFormat:
    name = "onnx"
    suffixes = (".onnx",)

    def check_available(self) -> None:
        missing = [name for name in ONNX_PACKAGES if importlib.util.find_spec(name) is None]
        if missing:
            raise ExportError(
                f"--format onnx needs {' and '.join(missing)} (the parity check runs the file in onnxruntime): "
                "pip install 'maskrcnn-dist[export]'"
            )

    def write(self, model: nn.Module, example: torch.Tensor, path: Path, metadata: dict[str, Any]) -> None:
        detections = {name: {0: "detections"} for name in ONNX_OUTPUTS}
        detections["masks"] = {0: "detections", 2: "height", 3: "width"}
        with quiet():
            torch.onnx.export(
                model,
                ([example],),
                str(path),
                dynamo=False,  # the module docstring says why
                opset_version=ONNX_OPSET,
                input_names=[ONNX_INPUT],
                output_names=list(ONNX_OUTPUTS),
                dynamic_axes={ONNX_INPUT: {1: "height", 2: "width"}, **detections},
            )

    def load(self, path: Path) -> Runner:
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = torch.get_num_threads()
        options.log_severity_level = 3  # errors only: its graph-optimisation notes are not for the user
        session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

        def run(image: torch.Tensor) -> Detection:
            outputs = session.run(None, {ONNX_INPUT: image.numpy()})
            return {name: torch.from_numpy(value) for name, value in zip(ONNX_OUTPUTS, outputs)}

        return run

    def metadata_place(self, out: Path) -> tuple[str, Path | None]:
        sidecar = out.with_suffix(".json")
        return f"the sidecar {sidecar.name}", sidecar


ExportFormat = TorchScriptFormat | OnnxFormat
FORMATS: dict[str, ExportFormat] = {f.name: f for f in (TorchScriptFormat(), OnnxFormat())}
