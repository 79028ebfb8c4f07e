"""The train table: every setting of `train` and `eval`, and building a TrainConfig from them.

Each field of the dataclasses below declares, once, its default, its flag name (the CLI's `--flag` and
the YAML key), its help text and its allowed values (fields.py's `option`). Everything else is derived
from that: the click options (cli.py), the YAML keys, the one type converter both use
(`FieldSpec.parse`), validation, and the argv of the demo's launcher processes (`to_argv`).

Precedence: dataclass defaults < YAML file < flags given on the command line.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from maskrcnn_launcher.contract import load_yaml

from ..errors import ConfigError
from .fields import INT64_MAX, FieldSpec, field_specs, option
from .presets import RECIPES

__all__ = [
    "AMP_DTYPES",
    "BACKBONE_NORMS",
    "BY_FLAG",
    "CHECK_MODES",
    "DEVICES",
    "DATA_PATH_FLAGS",
    "DATA_SOURCE_FLAGS",
    "ENGINES",
    "DATA_AUGMENTATIONS",
    "EXIF_ORIENTATIONS",
    "FIELDS",
    "LR_SCHEDULERS",
    "MODEL_NAMES",
    "DataConfig",
    "ModelConfig",
    "OptimConfig",
    "PeersConfig",
    "PipelineConfig",
    "TrainConfig",
    "apply_overrides",
    "build_config",
    "config_to_dict",
    "fp16_on_cpu_problem",
    "load_yaml_config",
    "saved_data_flags",
    "saved_model_flags",
    "to_argv",
]

MODEL_NAMES = ("maskrcnn_resnet50_fpn", "maskrcnn_resnet50_fpn_v2", "maskrcnn_resnet18_fpn")
ENGINES = ("local", "ddp", "pipeline")
AMP_DTYPES = ("auto", "bfloat16", "float16")  # perf.AMP_DTYPES maps them to torch dtypes
DEVICES = ("auto", "cpu", "cuda")
BACKBONE_NORMS = ("auto", "frozen", "batch")
CHECK_MODES = ("header", "full", "off")  # data/check.py says what each one checks
EXIF_ORIENTATIONS = ("auto", "apply", "ignore")  # data/orientation.py says what each one reads
DATA_AUGMENTATIONS = ("hflip", "multiscale", "lsj")  # data/augment.py says what each one does
# Those that give the model its training sizes: the model's own resize would undo them.
SIZED_BY_DATA = ("multiscale", "lsj")
LR_SCHEDULERS = ("multisteplr", "cosineannealinglr")  # torchvision's reference names; modeling/optim.py

# ----------------------------------------------------------------------------------------------
# The settings.
# ----------------------------------------------------------------------------------------------


@dataclass
class DataConfig:
    # data/detect.py finds the splits under it: any COCO instances JSON (the common annotation tools'
    # exports), split names from file and folder names, the image folder where its file_names are.
    data_path: Path | None = option(
        None,
        "dataset folder as an annotation tool exported it (COCO, Roboflow, CVAT, Label Studio, ...): "
        "the splits and image folders are found in it",
    )
    # The universal form (detectron2's json_file + image_root): no layout to guess.
    train_annotations: Path | None = option(None, "COCO instances JSON of the train split (with --train-images)")
    train_images: Path | None = option(None, "folder the train split's file_names are relative to")
    val_annotations: Path | None = option(None, "COCO instances JSON of the val split (with --val-images)")
    val_images: Path | None = option(None, "folder the val split's file_names are relative to")
    # Exports with no val split (CVAT task, Label Studio): carved by --seed, the same on every rank and resume.
    val_fraction: float | None = option(
        None, "no val split: carve this fraction of the train images into one, chosen by --seed", above=0, below=1
    )
    # CVAT exports brush masks as RLE with iscrowd 1; torchvision's reference never trains crowd regions.
    crowd_as_instances: bool = option(
        False, "train (and evaluate) crowd annotations (iscrowd 1, e.g. CVAT's brush masks) as instances"
    )
    synthetic_images: int = option(
        0,
        "generate a synthetic COCO set of N training images (at --data-path or OUTPUT_DIR/data)",
        minimum=0,
        maximum=1_000_000,
    )
    synthetic_image_size: int = option(128, "largest side of the synthetic images, pixels", minimum=32, maximum=4096)
    batch_size: int = option(2, "images per step per process", minimum=1, maximum=4096)
    workers: int = option(2, "DataLoader worker processes", minimum=0, maximum=256)
    # torchvision's default: group images of similar aspect ratio into batches (less padding).
    aspect_ratio_group_factor: int = option(
        3, "group images by aspect ratio into batches (-1: off)", minimum=-1, maximum=100
    )
    val_batch_size: int = option(2, "images per evaluation batch", minimum=1, maximum=4096)
    check_data: str = option(
        "header",
        "check every image before training: header (opens, size as annotated, not truncated), "
        "full (also decode every pixel) or off (only that the files exist)",
        choices=CHECK_MODES,
    )
    data_augmentation: str = option(
        "hflip",
        "training augmentation, as torchvision's references: hflip (a horizontal flip), multiscale (short side "
        "drawn from 480-800 x --min-size/800, then a flip) or lsj (large-scale jitter: scale 0.1-2 of a square "
        "of 1.28 x --min-size, cropped and padded to it, then a flip)",
        choices=DATA_AUGMENTATIONS,
    )
    use_copypaste: bool = option(
        False,
        "paste a random subset of the previous image's objects onto each image of a batch (torchvision's "
        "SimpleCopyPaste; needs --data-augmentation lsj)",
    )
    skip_bad_images: bool = option(
        False, "train without the images that fail --check-data (one warning) instead of stopping"
    )
    # Annotation tools show a photo turned by its EXIF orientation and annotate it in that frame.
    exif_orientation: str = option(
        "auto",
        "images with an EXIF orientation: auto (read as shown when the annotation's width x height is the "
        "shown size, as annotation tools export; as stored when it is only the stored size of a turned "
        "image), apply (always as shown) or ignore (always as stored)",
        choices=EXIF_ORIENTATIONS,
    )

    # A restart must not parse COCO's 450 MB of JSON and check 118k images again (data/cache.py).
    data_cache: str = option(
        "auto",
        "where the parsed annotations and the data check's verdicts are cached for the next start: auto "
        "(OUTPUT_DIR/cache for train and eval; none for the other commands), off, or a folder",
    )

    def sized_by_data(self) -> bool:
        """Whether the augmentation gives the model its training sizes (torchvision's `_skip_resize`)."""
        return self.data_augmentation in SIZED_BY_DATA


@dataclass
class ModelConfig:
    name: str = option(
        "maskrcnn_resnet50_fpn",
        "maskrcnn_resnet50_fpn, maskrcnn_resnet50_fpn_v2 or maskrcnn_resnet18_fpn (small, for CPU)",
        flag="model",
        choices=MODEL_NAMES,
    )
    min_size: int = option(800, "resize so the short side is this many pixels", minimum=32, maximum=8192)
    max_size: int = option(1333, "... and the long side at most this", minimum=32, maximum=8192)
    # Local files only: nothing is downloaded at run time.
    weights: Path | None = option(
        None, "local file of Mask R-CNN weights (class-dependent layers re-initialised if the class count differs)"
    )
    weights_backbone: Path | None = option(None, "local file of ResNet (ImageNet) weights")
    trainable_backbone_layers: int | None = option(
        None, "0-5 backbone stages to train (default 3 with weights, else 5)", minimum=0, maximum=5
    )
    # "auto": frozen BatchNorm when pretrained weights are given (torchvision's choice), batch stats otherwise.
    backbone_norm: str = option("auto", "auto, frozen or batch BatchNorm in the backbone", choices=BACKBONE_NORMS)
    # channels_last (NHWC) weights and activations for the backbone + FPN and the RPN head: oneDNN's
    # fast bf16 convolutions need it (perf.py; measured by benchmarks/bench_throughput.py).
    channels_last: bool = option(
        True, "channels_last (NHWC) memory format for the backbone, FPN and RPN head (fast bf16 convolutions)"
    )

    # Fine-tuning's frozen BatchNorm computed inside the convolution before it (modeling/fold_bn.py):
    # training steps only; evaluation, prediction and export compute as torchvision does. On: a --amp step
    # of R50-FPN at 800 px took 1.18-1.31x less time with it (benchmarks/bench_step.py, docs/performance.md).
    # Nothing to fold with batch statistics (--backbone-norm batch, the default without weights).
    fold_frozen_bn: bool = option(
        True, "fold frozen BatchNorm into the preceding convolution in training steps (eval and export unchanged)"
    )

    def resolved_backbone_norm(self) -> str:
        """The backbone's BatchNorm with these settings, "frozen" or "batch" ("auto" resolved)."""
        if self.backbone_norm != "auto":
            return self.backbone_norm
        return "frozen" if (self.weights or self.weights_backbone) else "batch"


@dataclass
class OptimConfig:
    # torchvision's 0.02 is for 16 images per step; it diverges from scratch on small batches.
    lr: float = option(0.01, "base learning rate", above=0)
    # 1 or more never forgets a gradient: the update grows without bound.
    momentum: float = option(0.9, "SGD momentum", minimum=0, below=1)
    weight_decay: float = option(1e-4, "SGD weight decay", minimum=0)
    lr_steps: tuple[int, ...] = option(
        (16, 22), "epochs at which the rate is multiplied by --lr-gamma, comma separated", minimum=0
    )
    lr_gamma: float = option(0.1, "decay factor at each of --lr-steps", above=0, maximum=1)
    lr_scheduler: str = option(
        "multisteplr",
        "multisteplr (x --lr-gamma at each of --lr-steps) or cosineannealinglr (cosine to 0 over the run's "
        "epochs: --epochs, or those --max-steps reaches into), after the warm-up",
        choices=LR_SCHEDULERS,
    )
    # None: one parameter group, as torchvision's reference without the flag (and this kit before it).
    norm_weight_decay: float | None = option(
        None, "weight decay of the normalization layers' parameters (default: --weight-decay)", minimum=0
    )
    warmup_iters: int = option(1000, "linear warm-up steps", minimum=0)
    warmup_factor: float = option(1e-3, "starting fraction of the rate during warm-up", above=0, maximum=1)
    # A negative coefficient would reverse the gradients.
    clip_grad_norm: float | None = option(None, "clip the global gradient norm to this value", above=0)


@dataclass
class PeersConfig:
    """How long this process waits for the others: shared by the ddp process group and the pipeline's RPC."""

    timeout: float = option(
        120.0,
        "seconds before a silent peer counts as lost (RPC and process-group timeouts)",
        flag="rpc-timeout",
        above=0,
    )
    # torch's own bound on forming the group is 30 minutes.
    join_timeout: float = option(
        600.0, "pipeline: seconds to wait for every process to join RPC before exiting non-zero", above=0
    )


@dataclass
class PipelineConfig:
    micro_batches: int = option(2, "pipeline: micro-batches per batch (at most --batch-size)", minimum=1, maximum=4096)
    # Send stage-1 features to stage 2 in bfloat16: half the bytes on the wire.
    bf16_transport: bool = option(False, "pipeline: send features in bfloat16")


@dataclass
class TrainConfig:
    engine: str = option(
        "local",
        "local (one process), ddp (DistributedDataParallel, under torchrun or the launcher), "
        "pipeline (model parallel over RPC, under the launcher)",
        choices=ENGINES,
    )
    # torchvision's reference converts only when distributed too: one process has the whole batch.
    sync_bn: bool = option(
        False,
        "ddp: BatchNorm statistics over the whole batch of every rank (SyncBatchNorm); no effect with one "
        "process; not with frozen BatchNorm or --engine pipeline",
    )
    # Expanded by build_config under the YAML file's and the command line's other flags.
    recipe: str | None = option(
        None,
        "torchvision's published recipe: the flags it sets (docs/reference/flags.md#recipes), "
        "under the ones given beside it",
        choices=tuple(RECIPES),
    )
    epochs: int = option(26, "number of epochs", minimum=1, maximum=1_000_000)
    # Short schedules and smoke tests; None runs the whole schedule.
    max_steps: int | None = option(None, "stop after this many optimizer steps in total", minimum=1)
    seed: int = option(0, "seed for weights, data order, flips and sampling", minimum=0, maximum=INT64_MAX)
    output_dir: Path = option(Path("runs/train"), "metrics, checkpoints, report")
    device: str = option("auto", "auto, cpu or cuda", choices=DEVICES)
    threads: int | None = option(None, "CPU threads per process (torch.set_num_threads)", minimum=1, maximum=1024)
    amp: bool = option(
        False,
        "mixed precision: bf16 autocast on CPU, fp16 + grad scaler on CUDA (see --amp-dtype); "
        "losses, RoI ops, box decoding and the optimizer stay fp32",
    )
    amp_dtype: str = option(
        "auto", "autocast dtype under --amp: auto (bf16 on CPU, fp16 on CUDA), bfloat16 or float16", choices=AMP_DTYPES
    )
    # torch.compile needs a compiler at run time (modeling/compiled.py); without one it is off with one line.
    compile: bool = option(
        False,
        "torch.compile the backbone + FPN for training (dynamic shapes; local and ddp engines; needs a C++ "
        "compiler on CPU, a C compiler for Triton on CUDA)",
    )
    flush_denormal: bool = option(True, "flush denormal floats to zero on CPU (3-6x slower iterations without it)")
    resume: Path | None = option(
        None,
        "checkpoint file, directory, 'auto' (newest in OUTPUT_DIR/checkpoints, if any) or, for eval, predict "
        "and export, 'best' (OUTPUT_DIR/checkpoints/best.pt)",
    )
    # Never silently: a fresh run into a used --output-dir is refused unless this or --resume is given.
    overwrite: bool = option(
        False, "train into an --output-dir that holds a previous run: first move its files into replaced-<time>/"
    )
    test_only: bool = option(False, "only evaluate (with --resume or --weights)")
    print_freq: int = option(20, "log every N steps", minimum=1)
    # Periods in optimizer steps; 0 disables the periodic run (epoch ends always run both).
    val_period: int = option(0, "validation loss every N steps (0: at epoch ends only)", minimum=0)
    checkpoint_period: int = option(0, "checkpoint every N steps (0: at epoch ends only)", minimum=0)
    keep_checkpoints: int = option(3, "keep the newest K checkpoints", minimum=1)
    eval_every_epoch: bool = option(True, "COCO AP at every epoch end")
    # Checked against evaluation.METRIC_KEYS at start (best.check_best_metric): config sits below evaluation.
    best_metric: str = option(
        "segm_AP",
        "the evaluation metric that picks OUTPUT_DIR/checkpoints/best.pt, higher is better: "
        "bbox_AP, segm_AP, segm_AP50, ... (any AP key of an eval record)",
    )
    patience: int | None = option(
        None, "stop after N evaluations in a row without a new best --best-metric (default: never)", minimum=1
    )
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    peers: PeersConfig = field(default_factory=PeersConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)

    def total_steps(self, iters_per_epoch: int) -> int:
        """Optimizer steps this run makes: every epoch's batches, or --max-steps if fewer."""
        planned = self.epochs * iters_per_epoch
        return min(planned, self.max_steps) if self.max_steps else planned

    def validate(self) -> None:
        """Reject values that would fail later, deep inside torch, with a message naming the flag."""
        errors = [problem for spec in FIELDS if (problem := spec.problem(spec.get(self)))]
        errors += self.combination_problems()
        if errors:
            raise ConfigError("invalid configuration: " + "; ".join(errors))

    def combination_problems(self) -> list[str]:
        """Flags that are each valid but cannot work together, each problem naming them."""
        checks = [
            (list(self.optim.lr_steps) == sorted(self.optim.lr_steps), "--lr-steps must be increasing"),
            (self.model.max_size >= self.model.min_size, "--min-size must be <= --max-size"),
            (
                not (self.amp and self.amp_dtype == "float16" and self.engine == "pipeline"),
                "--amp-dtype float16 is not available with --engine pipeline: fp16 needs a gradient scaler, "
                "which distributed autograd cannot apply; the pipeline's --amp computes in bfloat16",
            ),
            (
                not (self.optim.norm_weight_decay is not None and self.engine == "pipeline"),
                "--norm-weight-decay is not available with --engine pipeline: its stages merge their "
                "optimizers as one parameter group, and the flag makes two",
            ),
            (
                not self.data.use_copypaste or self.data.data_augmentation == "lsj",
                "--use-copypaste needs --data-augmentation lsj: it pastes between images of one size, "
                "as torchvision's references require",
            ),
            (
                not (self.sync_bn and self.engine == "pipeline"),
                "--sync-bn is for --engine ddp: a pipeline stage sees one micro-batch at a time, never the "
                "batch's other images",
            ),
            (
                not (self.sync_bn and self.model.resolved_backbone_norm() == "frozen"),
                "--sync-bn with frozen BatchNorm (--backbone-norm frozen, or auto with --weights or "
                "--weights-backbone): frozen statistics are never computed, so there is nothing to synchronise; "
                "add --backbone-norm batch",
            ),
            (
                not (self.compile and self.engine == "pipeline"),
                "--compile is for --engine local and ddp: the pipeline's stages run eagerly (compiled stages under "
                "distributed autograd are untested); leave out --compile",
            ),
            (not (self.overwrite and self.resume is not None), "--overwrite and --resume: give one of them"),
            (
                not self.test_only or self.resume is not None or self.model.weights is not None,
                "--test-only (eval) needs --resume CHECKPOINT or --weights FILE",
            ),
            (
                self.test_only or str(self.resume) != "best",
                "--resume best is for eval, predict and export: train continues a run with --resume auto, "
                "and starts from a run's best model with --weights RUN/checkpoints/best.pt",
            ),
            (
                not (self.data.synthetic_images and _split_flags_given(self.data)),
                "--synthetic-images generates the data: leave out --train-annotations, --train-images, "
                "--val-annotations and --val-images",
            ),
            (
                self.patience is None or self.eval_every_epoch or self.test_only,
                "--patience counts evaluations, and --no-eval-every-epoch leaves only the one at the end: "
                "add --eval-every-epoch",
            ),
        ]
        problems = [message for ok, message in checks if not ok]
        if self.engine == "pipeline" and (micro := self.micro_batches_problem()):
            problems.append(micro)
        if self.device == "cpu" and (fp16 := fp16_on_cpu_problem(self.amp, self.amp_dtype)):
            problems.append(fp16)
        return problems

    def micro_batches_problem(self) -> str | None:
        """Why the batch cannot be split into --micro-batches (the pipeline engine, and profile's pipeline
        candidates), or None."""
        if self.pipeline.micro_batches <= self.data.batch_size:
            return None
        return (
            f"--micro-batches {self.pipeline.micro_batches} > --batch-size {self.data.batch_size}: "
            "every micro-batch needs at least one image"
        )


def _split_flags_given(data: DataConfig) -> bool:
    names = ("train_annotations", "train_images", "val_annotations", "val_images")
    return any(getattr(data, name) is not None for name in names)


def fp16_on_cpu_problem(amp: bool, amp_dtype: str) -> str | None:
    """Why fp16 autocast cannot run on a CPU (checked at parse time for --device cpu, and by the engine
    once --device auto has resolved to the CPU), or None."""
    if amp and amp_dtype == "float16":
        return (
            "--amp-dtype float16 on the CPU: CPUs have no fast fp16 kernels and no gradient scaler runs there "
            "(about 3x slower than fp32); use --amp-dtype bfloat16 (the CPU default) or --device cuda"
        )
    return None


#: Every setting, in declaration order.
FIELDS: tuple[FieldSpec, ...] = tuple(field_specs(TrainConfig))
#: Flag name (as on the CLI and in YAML files) -> its field.
BY_FLAG: dict[str, FieldSpec] = {spec.flag: spec for spec in FIELDS}
#: Where a dataset is: every command that reads a split takes these (data/resolve.py resolves them).
DATA_PATH_FLAGS = ("data-path", "train-annotations", "train-images", "val-annotations", "val-images")
DATA_SOURCE_FLAGS = (*DATA_PATH_FLAGS, "val-fraction", "crowd-as-instances")

# ----------------------------------------------------------------------------------------------
# Building a config.
# ----------------------------------------------------------------------------------------------


def apply_overrides(cfg: Any, values: dict[str, Any], source: str, table: dict[str, FieldSpec] = BY_FLAG) -> Any:
    """Set fields of `cfg` (a TrainConfig, or the dataclass `table` describes) from a flag-name -> value
    mapping; unknown names are an error that names them."""
    unknown = sorted(set(values) - set(table))
    if unknown:
        raise ConfigError(f"{source}: unknown key(s) {', '.join(unknown)}; known keys are the command's flags")
    for flag, value in values.items():
        spec = table[flag]
        try:
            parsed = spec.parse(value)
        except ValueError as exc:
            raise ConfigError(f"{source}: {flag}: value {value!r} does not fit ({exc})") from exc
        if problem := spec.problem(parsed):
            raise ConfigError(f"{source}: {problem}")
        spec.set(cfg, parsed)
    return cfg


def load_yaml_config(path: Path) -> dict[str, Any]:
    """Read a YAML config file of flag names (dashes or underscores) -> values."""
    try:
        raw = load_yaml(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"--config {path}: the file does not exist") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"--config {path}: not a text (UTF-8 YAML) file ({exc.reason} at byte {exc.start})") from exc
    except OSError as exc:
        raise ConfigError(f"--config {path}: cannot read it: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"--config {path}: not valid YAML: {exc}") from exc
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"--config {path}: must hold a mapping of flag names to values")
    values: dict[str, Any] = {}
    for key, value in raw.items():
        flag = str(key).replace("_", "-")
        if flag in values:  # data_path and data-path name one flag: which one wins would be a guess
            raise ConfigError(f"--config {path}: {flag} is given twice (as {key!r} and with the other spelling)")
        values[flag] = value
    return values


def build_config(yaml_path: Path | None, cli_values: dict[str, Any], base: dict[str, Any] | None = None) -> TrainConfig:
    """Defaults, then `base` (a checkpoint's trained model: modeling/trained.py), then the --recipe's
    flags (named on the command line, or else in the YAML file), then the YAML file, then the flags the
    user actually gave."""
    cfg = TrainConfig()
    if base:
        apply_overrides(cfg, {k: v for k, v in base.items() if v is not None}, "checkpoint")
    from_yaml = load_yaml_config(yaml_path) if yaml_path is not None else {}
    given = {k: v for k, v in cli_values.items() if v is not None}
    recipe = given.get("recipe", from_yaml.get("recipe"))
    if recipe is not None:
        apply_overrides(cfg, {"recipe": recipe}, "command line" if "recipe" in given else str(yaml_path))
        apply_overrides(cfg, RECIPES[cfg.recipe], f"--recipe {cfg.recipe}")
    apply_overrides(cfg, from_yaml, str(yaml_path))
    apply_overrides(cfg, given, "command line")
    cfg.validate()
    return cfg


def saved_model_flags(saved: dict[str, Any]) -> dict[str, Any]:
    """The model section of a checkpoint's config (config_to_dict's form) as flag-name -> value, so a
    checkpoint rebuilds the model it was trained with. Weight files are left out: they were the starting
    point, the checkpoint holds the result (and they need not exist where the checkpoint is read)."""
    model = saved.get("model") if isinstance(saved, dict) else None
    if not isinstance(model, dict):
        return {}
    skip = ("weights", "weights_backbone")
    flags = {s.flag: model[s.name] for s in FIELDS if s.section == "model" and s.name in model and s.name not in skip}
    # Without the weight files "auto" would mean another BatchNorm (and another state dict layout).
    as_trained = ModelConfig(
        weights=model.get("weights"),
        weights_backbone=model.get("weights_backbone"),
        backbone_norm=model.get("backbone_norm", "auto"),
    )
    flags["backbone-norm"] = as_trained.resolved_backbone_norm()
    return flags


def saved_data_flags(saved: dict[str, Any]) -> dict[str, Any]:
    """Where a checkpoint's run found its data (DATA_SOURCE_FLAGS and the seed that carved a val split),
    as flag-name -> value from its config (config_to_dict's form); empty when it records none."""
    data = saved.get("data") if isinstance(saved, dict) else None
    if not isinstance(data, dict):
        return {}
    flags = {
        s.flag: data[s.name]
        for s in FIELDS
        if s.section == "data" and s.flag in DATA_SOURCE_FLAGS and data.get(s.name) not in (None, False)
    }
    if flags and isinstance(saved.get("seed"), int):
        flags["seed"] = saved["seed"]
    return flags


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


def to_argv(values: dict[str, Any]) -> list[str]:
    """Flag-name -> value as command-line words (`--flag value`, `--flag`/`--no-flag` for booleans)."""
    argv: list[str] = []
    for flag, value in values.items():
        spec = BY_FLAG[flag]
        if spec.kind is bool:
            argv.append(f"--{'' if spec.parse(value) else 'no-'}{flag}")
        elif spec.kind is tuple and isinstance(value, (list, tuple)):
            argv += [f"--{flag}", ",".join(str(v) for v in value)]
        else:
            argv += [f"--{flag}", str(value)]
    return argv
