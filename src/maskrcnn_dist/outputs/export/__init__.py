"""`maskrcnn-dist export`: TorchScript and ONNX files of a checkpoint, each checked against the eager
model (command.py: the steps; formats.py: the two formats and the ONNX exporter's choice; parity.py:
the comparison and its tolerances)."""

from .command import FAILED_SUFFIX, ExportSummary, export_model
from .formats import FORMATS, METADATA_FILE, ONNX_INPUT, ONNX_OUTPUTS, ExportError
from .parity import TOLERANCES, Cut, ImageParity, Tolerances, compare

__all__ = [
    "FAILED_SUFFIX",
    "FORMATS",
    "METADATA_FILE",
    "ONNX_INPUT",
    "ONNX_OUTPUTS",
    "TOLERANCES",
    "Cut",
    "ExportError",
    "ExportSummary",
    "ImageParity",
    "Tolerances",
    "compare",
    "export_model",
]
