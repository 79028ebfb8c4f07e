"""`TrainConfig`: the run's own settings beside its sections (sections.py), and the rules that each
valid value must also follow together with the others (`combination_problems`).

`FIELDS` lists every setting of the table once, in declaration order, and `BY_FLAG` finds one by its
flag name; building a TrainConfig from defaults, a recipe, a YAML file and flags is build.py's.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..errors import ConfigError
from .fields import INT64_MAX, FieldSpec, field_specs, option
from .presets import RECIPES
from .sections import (
    AMP_DTYPES,
    DEVICES,
    ENGINES,
    DataConfig,
    ModelConfig,
    OptimConfig,
    PeersConfig,
    PipelineConfig,
)

__all__ = [
    "BY_FLAG",
    "DATA_PATH_FLAGS",
    "DATA_SOURCE_FLAGS",
    "FIELDS",
    "TrainConfig",
    "fp16_on_cpu_problem",
]


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
        "mixed precision: bf16 autocast on CPU and on GPUs with bf16 units, fp16 + grad scaler on older GPUs "
        "(see --amp-dtype); losses, RoI ops, box decoding and the optimizer stay fp32",
    )
    amp_dtype: str = option(
        "auto",
        "autocast dtype under --amp: auto (bf16, or fp16 on a GPU without bf16 units), bfloat16 or float16",
        choices=AMP_DTYPES,
    )
    # perf.set_device_math: the convolutions already run in TF32 under torch's defaults; this adds the
    # matrix products (docs/gpu-check.md measured no change on an H200: the convolutions dominate).
    tf32: bool = option(True, "TF32 for fp32 convolutions and matrix products on CUDA (Ampere and later)")
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

    def validate(self, from_recipe: Collection[str] = ()) -> None:
        """Reject values that would fail later, deep inside torch, with a message naming the flag.
        `from_recipe`: the flags whose values --recipe set (none given beside it): a problem they cause
        names the recipe and the flag that overrides it."""
        errors = [problem for spec in FIELDS if (problem := spec.problem(spec.get(self)))]
        errors += [_recipe_hint(problem, self, from_recipe) for problem in self.combination_problems(from_recipe)]
        if errors:
            raise ConfigError("invalid configuration: " + "; ".join(errors))

    def combination_problems(self, from_recipe: Collection[str] = ()) -> list[str]:
        """Flags that are each valid but cannot work together, each problem naming them (and, where
        --recipe set --sync-bn, the flag that turns it off: the recipe's, not the one typed)."""
        sync_bn = f"--recipe {self.recipe} sets --sync-bn, which" if "sync-bn" in from_recipe else "--sync-bn"
        checks = [
            (list(self.optim.lr_steps) == sorted(self.optim.lr_steps), "--lr-steps must be increasing"),
            (self.model.max_size >= self.model.min_size, "--min-size must be <= --max-size"),
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
                f"{sync_bn} is for --engine ddp: a pipeline stage sees one micro-batch at a time, never the "
                "batch's other images" + ("; add --no-sync-bn" if "sync-bn" in from_recipe else ""),
            ),
            (
                not (self.sync_bn and self.model.resolved_backbone_norm() == "frozen"),
                f"{sync_bn} with frozen BatchNorm (--backbone-norm frozen, or auto with --weights or "
                "--weights-backbone): frozen statistics are never computed, so there is nothing to synchronise; "
                + ("add --no-sync-bn" if "sync-bn" in from_recipe else "add --backbone-norm batch"),
            ),
            (
                not (self.compile and self.engine == "pipeline"),
                "--compile is for --engine local and ddp: the pipeline's stages run eagerly (a stage's backward from "
                "the gradients of its outputs is untested compiled); leave out --compile",
            ),
            (
                not (self.peers.elastic and self.engine != "ddp"),
                f"--elastic is for --engine ddp: a lost worker's survivors regroup its data-parallel ranks, and "
                f"--engine {self.engine} has none; leave out --elastic",
            ),
            (
                self.peers.elastic or not self.peers.elastic_rules_set(),
                "--elastic-min-size and --elastic-min-wait are rules of an elastic group: add --elastic, or leave "
                "them out",
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

    def unrecorded(self) -> TrainConfig:
        """This evaluation's config when it records nothing (`eval` without --output-dir): --data-cache
        auto (OUTPUT_DIR/cache) off, as for the other read-only commands; a named cache folder is kept."""
        if not self.test_only:
            raise ValueError("only an evaluation (--test-only) runs without recording")
        if self.data.data_cache != "auto":
            return self
        return replace(self, data=replace(self.data, data_cache="off"))

    def micro_batches_problem(self) -> str | None:
        """Why the batch cannot be split into --micro-batches (the pipeline engine, and profile's pipeline
        candidates), or None."""
        if self.pipeline.micro_batches <= self.data.batch_size:
            return None
        return (
            f"--micro-batches {self.pipeline.micro_batches} > --batch-size {self.data.batch_size}: "
            "every micro-batch needs at least one image"
        )


def _recipe_hint(problem: str, cfg: TrainConfig, from_recipe: Collection[str]) -> str:
    """`problem` with the flags in it that --recipe set named as the recipe's, and how to override them."""
    named = [flag for flag in from_recipe if re.search(rf"--{re.escape(flag)}\b", problem)]
    if not named or f"--recipe {cfg.recipe}" in problem:
        return problem
    settings = ", ".join(f"--{flag} {_shown(BY_FLAG[flag].get(cfg))}" for flag in named)
    flags = " or ".join(f"--{flag}" for flag in named)
    return f"{problem} (--recipe {cfg.recipe} sets {settings}: give {flags} to override it)"


def _shown(value: object) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


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
#: Where a dataset is: every command that reads a split takes these (data/sources/resolve.py resolves them).
DATA_PATH_FLAGS = ("data-path", "train-annotations", "train-images", "val-annotations", "val-images")
DATA_SOURCE_FLAGS = (*DATA_PATH_FLAGS, "val-fraction", "crowd-as-instances")
