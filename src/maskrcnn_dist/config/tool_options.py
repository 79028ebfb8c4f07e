"""The options of the commands beside training (predict, report --gallery, export, profile): their own
settings, declared like the train table's, and the train flags each one shares (one definition each)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ..errors import ConfigError
from .build import apply_overrides
from .fields import FieldSpec, field_specs, option
from .train_config import DATA_SOURCE_FLAGS

__all__ = [
    "EXPORT_BY_FLAG",
    "EXPORT_FIELDS",
    "EXPORT_FORMATS",
    "EXPORT_TRAIN_FLAGS",
    "GALLERY_MAX",
    "PREDICT_BY_FLAG",
    "PREDICT_FIELDS",
    "PREDICT_TRAIN_FLAGS",
    "PROFILE_BY_FLAG",
    "PROFILE_FIELDS",
    "PROFILE_TRAIN_FLAGS",
    "ExportConfig",
    "PredictConfig",
    "ProfileConfig",
    "build_export_config",
    "build_predict_config",
    "build_profile_config",
]

T = TypeVar("T")


@dataclass
class PredictConfig:
    """`maskrcnn-dist predict`'s own settings. The model, weights, device and amp flags are the train
    flags named in PREDICT_TRAIN_FLAGS (one definition each)."""

    out: Path | None = option(None, "folder for the drawings, detections.json and images.json (required)")
    # The results file keeps everything the model returns, so that it scores what `eval` scores.
    score_threshold: float = option(
        0.5, "draw detections with at least this score (detections.json keeps all)", minimum=0.0, maximum=1.0
    )
    split: str = option("val", "with --data-path (or the split flags): the split whose images to predict")
    batch_size: int = option(2, "images per forward pass (eval's --val-batch-size)", minimum=1, maximum=4096)
    # Never silently, as for train's --output-dir: earlier predictions in --out are refused or moved aside.
    overwrite: bool = option(
        False, "--out holds earlier predictions: first move them (results, drawings) into replaced-<time>/"
    )


#: `report --gallery N`: a few images to look at, not an export (that is `predict`).
GALLERY_MAX = 64


#: Train flags that `predict` (and `report --gallery`) share: what builds and loads the model, where it
#: runs, and how images are read.
PREDICT_TRAIN_FLAGS = (
    "resume",
    "weights",
    "output-dir",  # the run whose checkpoints `--resume auto|best` names
    *DATA_SOURCE_FLAGS,
    "seed",  # the carve of --val-fraction (default: the checkpoint's)
    "exif-orientation",
    "model",
    "min-size",
    "max-size",
    "device",
    "amp",
    "amp-dtype",
    "threads",
)


EXPORT_FORMATS = ("torchscript", "onnx")


@dataclass
class ExportConfig:
    """`maskrcnn-dist export`'s own settings. The model and weights flags are the train flags named in
    EXPORT_TRAIN_FLAGS; the images of the parity check are its --images option (files or folders)."""

    format: str | None = option(None, "torchscript or onnx (required)", choices=EXPORT_FORMATS)
    out: Path | None = option(None, "the file to write: .pt for torchscript, .onnx for onnx (required)")
    parity_images: int = option(
        4, "images the exported and the eager model both run for the parity check", minimum=1, maximum=64
    )
    # An export that fails its parity check never replaces a good file (it is kept as OUT.failed).
    overwrite: bool = option(False, "replace an existing --out, once the new export has passed the parity check")


#: Train flags that `export` shares: what builds and loads the model, and where the parity images are.
EXPORT_TRAIN_FLAGS = (
    "resume",
    "weights",
    "output-dir",
    *DATA_SOURCE_FLAGS,
    "seed",
    "model",
    "min-size",
    "max-size",
    "threads",
)


@dataclass
class ProfileConfig:
    """`maskrcnn-dist profile`'s own settings. The model, size, batch, micro-batch, precision, device
    and thread flags are the train flags named in PROFILE_TRAIN_FLAGS (one definition each)."""

    topology: str | None = option(None, "topology file or packaged name to plan for (default: three-machines)")
    link_gbps: float = option(25.0, "modelled network bandwidth per link, Gbit/s", minimum=0.001, maximum=100_000)
    device_memory_gib: float | None = option(
        None, "memory of one device, GiB (default: the GPU's, or host RAM / processes on this host)", minimum=0.001
    )
    iterations: int = option(3, "measured passes per module (after one warm-up pass)", minimum=1, maximum=1000)
    shared_host: bool = option(False, "every pod runs on this one host (maskrcnn-launch local): they share its cores")
    write_topology: Path | None = option(None, "write the recommended topology here (the launcher's --topology format)")
    write_values: Path | None = option(
        None, "write the recommended engine, stages and replicas as Helm values (helm -f)"
    )


#: Train flags that `profile` shares: what builds the model and how a step runs.
PROFILE_TRAIN_FLAGS = (
    *DATA_SOURCE_FLAGS,
    "model",
    "min-size",
    "max-size",
    "batch-size",
    "micro-batches",
    "bf16-transport",
    "device",
    "amp",
    "amp-dtype",
    "threads",
    "channels-last",
    "backbone-norm",
    "seed",
)
PREDICT_FIELDS: tuple[FieldSpec, ...] = tuple(field_specs(PredictConfig))
PREDICT_BY_FLAG: dict[str, FieldSpec] = {spec.flag: spec for spec in PREDICT_FIELDS}
EXPORT_FIELDS: tuple[FieldSpec, ...] = tuple(field_specs(ExportConfig))
EXPORT_BY_FLAG: dict[str, FieldSpec] = {spec.flag: spec for spec in EXPORT_FIELDS}
PROFILE_FIELDS: tuple[FieldSpec, ...] = tuple(field_specs(ProfileConfig))
PROFILE_BY_FLAG: dict[str, FieldSpec] = {spec.flag: spec for spec in PROFILE_FIELDS}


def build_tool_config(config: T, values: dict[str, Any], by_flag: dict[str, FieldSpec], command: str) -> T:
    """A command's own flags (None: not given) over `config`'s defaults, checked like the train flags,
    and those of its REQUIRED flags that are missing named."""
    cfg = apply_overrides(config, {k: v for k, v in values.items() if v is not None}, "command line", by_flag)
    errors = [problem for spec in by_flag.values() if (problem := spec.problem(spec.get(cfg)))]
    required = REQUIRED.get(command, {})
    errors += [f"--{flag} {what} is required" for flag, what in required.items() if by_flag[flag].get(cfg) is None]
    if errors:
        raise ConfigError(f"invalid {command} options: " + "; ".join(errors))
    return cfg


#: command -> its flags that have no default, and what each one takes.
REQUIRED = {"predict": {"out": "DIR"}, "export": {"format": "|".join(EXPORT_FORMATS), "out": "FILE"}}


def build_profile_config(values: dict[str, Any]) -> ProfileConfig:
    return build_tool_config(ProfileConfig(), values, PROFILE_BY_FLAG, "profile")


def build_predict_config(values: dict[str, Any]) -> PredictConfig:
    return build_tool_config(PredictConfig(), values, PREDICT_BY_FLAG, "predict")


def build_export_config(values: dict[str, Any]) -> ExportConfig:
    return build_tool_config(ExportConfig(), values, EXPORT_BY_FLAG, "export")
