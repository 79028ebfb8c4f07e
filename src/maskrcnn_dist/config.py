"""Training configuration: dataclasses with the defaults detection users know from torchvision's
references, and an optional YAML file whose keys are the CLI's flag names.

Precedence: dataclass defaults < YAML file < flags given on the command line.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError

MODEL_NAMES = ("maskrcnn_resnet50_fpn", "maskrcnn_resnet50_fpn_v2", "maskrcnn_resnet18_fpn")
ENGINES = ("local", "ddp", "pipeline")
AMP_DTYPES = ("auto", "bfloat16", "float16")  # perf.AMP_DTYPES maps them to torch dtypes


@dataclass
class DataConfig:
    # A COCO root: annotations/instances_{train,val}[2017].json next to {train,val}[2017]/.
    data_path: Path | None = None
    # Generate a synthetic COCO set of this many training images under data_path (or the output dir).
    synthetic_images: int = 0
    synthetic_image_size: int = 128
    batch_size: int = 2
    workers: int = 2
    # torchvision's default: group images of similar aspect ratio into batches (less padding).
    aspect_ratio_group_factor: int = 3
    val_batch_size: int = 2


@dataclass
class ModelConfig:
    name: str = "maskrcnn_resnet50_fpn"
    min_size: int = 800
    max_size: int = 1333
    # Local files only: nothing is downloaded at run time.
    weights: Path | None = None
    weights_backbone: Path | None = None
    trainable_backbone_layers: int | None = None
    # "auto": frozen BatchNorm when pretrained weights are given (torchvision's choice), batch stats otherwise.
    backbone_norm: str = "auto"
    # channels_last (NHWC) weights and activations for the backbone + FPN and the RPN head: oneDNN's
    # fast bf16 convolutions need it (perf.py; measured by benchmarks/bench_throughput.py).
    channels_last: bool = True


@dataclass
class OptimConfig:
    # torchvision's 0.02 is for 16 images per step; it diverges from scratch on small batches.
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 1e-4
    lr_steps: tuple[int, ...] = (16, 22)
    lr_gamma: float = 0.1
    warmup_iters: int = 1000
    warmup_factor: float = 1e-3
    clip_grad_norm: float | None = None


@dataclass
class PipelineConfig:
    micro_batches: int = 2
    # Send stage-1 features to stage 2 in bfloat16: half the bytes on the wire.
    bf16_transport: bool = False
    rpc_timeout: float = 120.0
    # Seconds every process waits for the whole group to join RPC (torch's own bound is 30 minutes).
    join_timeout: float = 600.0


@dataclass
class TrainConfig:
    engine: str = "local"
    epochs: int = 26
    # Stop after this many optimizer steps in total (short schedules, smoke tests); None = whole schedule.
    max_steps: int | None = None
    seed: int = 0
    output_dir: Path = Path("runs/train")
    device: str = "auto"
    threads: int | None = None
    amp: bool = False
    # "auto": bf16 on CPU, fp16 with a gradient scaler on CUDA; or "bfloat16" / "float16".
    amp_dtype: str = "auto"
    flush_denormal: bool = True
    resume: Path | None = None
    test_only: bool = False
    print_freq: int = 20
    # Periods in optimizer steps; 0 disables the periodic run (epoch ends always run both).
    val_period: int = 0
    checkpoint_period: int = 0
    keep_checkpoints: int = 3
    eval_every_epoch: bool = True
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)

    def validate(self) -> None:
        """Reject values that would fail later, deep inside torch, with a message naming the flag."""
        checks = [
            (self.engine in ENGINES, f"--engine must be one of {', '.join(ENGINES)}, got {self.engine!r}"),
            (self.model.name in MODEL_NAMES, f"--model must be one of {', '.join(MODEL_NAMES)}"),
            (self.model.backbone_norm in ("auto", "frozen", "batch"), "--backbone-norm: auto|frozen|batch"),
            (self.epochs >= 1, "--epochs must be >= 1"),
            (self.max_steps is None or self.max_steps >= 1, "--max-steps must be >= 1"),
            (self.data.batch_size >= 1, "--batch-size must be >= 1"),
            (self.data.val_batch_size >= 1, "--val-batch-size must be >= 1"),
            (self.data.workers >= 0, "--workers must be >= 0"),
            (self.optim.lr > 0, "--lr must be > 0"),
            (self.optim.warmup_iters >= 0, "--warmup-iters must be >= 0"),
            (list(self.optim.lr_steps) == sorted(self.optim.lr_steps), "--lr-steps must be increasing"),
            (
                self.model.min_size >= 32 and self.model.max_size >= self.model.min_size,
                "--min-size must be >= 32 and <= --max-size",
            ),
            (self.pipeline.micro_batches >= 1, "--micro-batches must be >= 1"),
            (self.keep_checkpoints >= 1, "--keep-checkpoints must be >= 1"),
            (self.device in ("auto", "cpu", "cuda"), "--device must be auto, cpu or cuda"),
            (self.amp_dtype in AMP_DTYPES, f"--amp-dtype must be one of {', '.join(AMP_DTYPES)}"),
        ]
        errors = [message for ok, message in checks if not ok]
        if errors:
            raise ConfigError("invalid configuration: " + "; ".join(errors))


# Flag name (as on the CLI and in YAML files) -> (section, field). The CLI is built from this table,
# so a flag and its YAML key can never disagree.
FLAGS: dict[str, tuple[str | None, str]] = {
    "engine": (None, "engine"),
    "epochs": (None, "epochs"),
    "max-steps": (None, "max_steps"),
    "seed": (None, "seed"),
    "output-dir": (None, "output_dir"),
    "device": (None, "device"),
    "threads": (None, "threads"),
    "amp": (None, "amp"),
    "amp-dtype": (None, "amp_dtype"),
    "flush-denormal": (None, "flush_denormal"),
    "resume": (None, "resume"),
    "test-only": (None, "test_only"),
    "print-freq": (None, "print_freq"),
    "val-period": (None, "val_period"),
    "checkpoint-period": (None, "checkpoint_period"),
    "keep-checkpoints": (None, "keep_checkpoints"),
    "eval-every-epoch": (None, "eval_every_epoch"),
    "data-path": ("data", "data_path"),
    "synthetic-images": ("data", "synthetic_images"),
    "synthetic-image-size": ("data", "synthetic_image_size"),
    "batch-size": ("data", "batch_size"),
    "val-batch-size": ("data", "val_batch_size"),
    "workers": ("data", "workers"),
    "aspect-ratio-group-factor": ("data", "aspect_ratio_group_factor"),
    "model": ("model", "name"),
    "min-size": ("model", "min_size"),
    "max-size": ("model", "max_size"),
    "weights": ("model", "weights"),
    "weights-backbone": ("model", "weights_backbone"),
    "trainable-backbone-layers": ("model", "trainable_backbone_layers"),
    "backbone-norm": ("model", "backbone_norm"),
    "channels-last": ("model", "channels_last"),
    "lr": ("optim", "lr"),
    "momentum": ("optim", "momentum"),
    "weight-decay": ("optim", "weight_decay"),
    "lr-steps": ("optim", "lr_steps"),
    "lr-gamma": ("optim", "lr_gamma"),
    "warmup-iters": ("optim", "warmup_iters"),
    "warmup-factor": ("optim", "warmup_factor"),
    "clip-grad-norm": ("optim", "clip_grad_norm"),
    "micro-batches": ("pipeline", "micro_batches"),
    "bf16-transport": ("pipeline", "bf16_transport"),
    "rpc-timeout": ("pipeline", "rpc_timeout"),
    "join-timeout": ("pipeline", "join_timeout"),
}


def _coerce(section_obj: Any, name: str, value: Any, source: str) -> Any:
    """Convert a YAML or CLI value to the field's type, naming the key when it does not fit."""
    current = getattr(section_obj, name)
    hint = {f.name: f.type for f in dataclasses.fields(section_obj)}[name]
    if value is None:
        return None
    try:
        if "Path" in str(hint):
            return Path(value)
        if "tuple" in str(hint):
            items = value if isinstance(value, (list, tuple)) else str(value).split(",")
            return tuple(int(v) for v in items if str(v).strip() != "")
        if isinstance(current, bool) or hint == "bool":
            if isinstance(value, str):
                if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError(value)
                return value.lower() in ("true", "1", "yes")
            return bool(value)
        if "float" in str(hint):
            return float(value)
        if "int" in str(hint):
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return int(value)
        return str(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{source}: value {value!r} does not fit (expected {hint})") from exc


def apply_overrides(cfg: TrainConfig, values: dict[str, Any], source: str) -> TrainConfig:
    """Set fields from a flag-name -> value mapping; unknown names are an error that names them."""
    unknown = sorted(set(values) - set(FLAGS))
    if unknown:
        raise ConfigError(f"{source}: unknown key(s) {', '.join(unknown)}; known keys are the train flags")
    for flag, value in values.items():
        section, name = FLAGS[flag]
        target = cfg if section is None else getattr(cfg, section)
        setattr(target, name, _coerce(target, name, value, f"{source}: {flag}"))
    return cfg


def load_yaml_config(path: Path) -> dict[str, Any]:
    """Read a YAML config file of flag names (dashes or underscores) -> values."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError as exc:
        raise ConfigError(f"config file {path} does not exist") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {path} must hold a mapping of flag names to values")
    return {str(k).replace("_", "-"): v for k, v in raw.items()}


def build_config(yaml_path: Path | None, cli_values: dict[str, Any]) -> TrainConfig:
    """Defaults, then the YAML file, then the flags the user actually gave."""
    cfg = TrainConfig()
    if yaml_path is not None:
        apply_overrides(cfg, load_yaml_config(yaml_path), str(yaml_path))
    apply_overrides(cfg, {k: v for k, v in cli_values.items() if v is not None}, "command line")
    cfg.validate()
    return cfg


def config_to_dict(cfg: TrainConfig) -> dict[str, Any]:
    """Plain types only (str for paths, lists for tuples): safe for JSON and weights_only checkpoints."""

    def plain(value: Any) -> Any:
        if isinstance(value, Path):
            return str(value)
        if isinstance(value, tuple):
            return list(value)
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value

    return plain(dataclasses.asdict(cfg))
