"""The sections' table: every setting of `train` and `eval` but the run's own, one dataclass per
section (data, model, optim, peers, pipeline), and the values their choices allow.

Each field declares, once, its default, its flag name (the CLI's `--flag` and the YAML key), its help
text and its allowed values (fields.py's `option`); the click options, the YAML keys, the converter and
the range checks are derived from that. `TrainConfig` (train_config.py) holds these sections.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from .fields import option

__all__ = [
    "AMP_DTYPES",
    "BACKBONE_NORMS",
    "CHECK_MODES",
    "DATA_AUGMENTATIONS",
    "DEVICES",
    "HEADS",
    "ENGINES",
    "EXIF_ORIENTATIONS",
    "LR_SCHEDULERS",
    "MODEL_NAMES",
    "PIPELINE_SCHEDULES",
    "DataConfig",
    "ModelConfig",
    "OptimConfig",
    "PeersConfig",
    "PipelineConfig",
]

MODEL_NAMES = ("maskrcnn_resnet50_fpn", "maskrcnn_resnet50_fpn_v2", "maskrcnn_resnet18_fpn")
ENGINES = ("local", "ddp", "pipeline")
AMP_DTYPES = ("auto", "bfloat16", "float16")  # perf.AMP_DTYPES maps them to torch dtypes
DEVICES = ("auto", "cpu", "cuda")
BACKBONE_NORMS = ("auto", "frozen", "batch")
HEADS = ("batched", "torchvision")  # modeling/batched/ says what the batched form computes
CHECK_MODES = ("header", "full", "off")  # data/images/check.py says what each one checks
EXIF_ORIENTATIONS = ("auto", "apply", "ignore")  # data/images/orientation.py says what each one reads
DATA_AUGMENTATIONS = ("hflip", "multiscale", "lsj")  # data/transforms/augment.py says what each one does
# Those that give the model its training sizes: the model's own resize would undo them.
SIZED_BY_DATA = ("multiscale", "lsj")
LR_SCHEDULERS = ("multisteplr", "cosineannealinglr")  # torchvision's reference names; modeling/optim.py
PIPELINE_SCHEDULES = ("1f1b", "gpipe")  # engines/pipeline/schedule.py says what each one does


def cache_folder_problem(value: str) -> str | None:
    """What is wrong with a --data-cache value (words after the flag), or None: `auto`, `off`, or a folder
    that is there or can be made (no file, device or link loop on its way)."""
    if value in ("auto", "off"):
        return None
    if not value.strip():
        return f"{value!r} names no folder (it would cache into the current folder): give auto, off or a folder"
    if value.strip().lower() in ("auto", "off"):
        return f"{value!r}: write {value.strip().lower()} in lower case (./{value.strip()} names a folder of that name)"
    path = Path(value)
    for where in (path, *path.parents):
        try:
            mode = os.stat(where).st_mode
        except (FileNotFoundError, NotADirectoryError):
            continue  # made when the cache is first written (or a file on the way, named below)
        except OSError as e:  # a link loop, a folder it may not enter
            return f"{value}: {where}: {e.strerror}; give auto, off or a folder"
        if stat.S_ISDIR(mode):
            return None
        kind = "a file" if stat.S_ISREG(mode) else "a device or other special file"
        if where == path:
            return f"{value} is {kind}; it takes a folder to keep the caches in (or auto, or off: no cache)"
        return f"{value}: {where} is {kind}, so no folder can be made under it"
    return None


@dataclass
class DataConfig:
    # data/sources/detect.py finds the splits under it: any COCO instances JSON (the common annotation tools'
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

    # A restart must not parse COCO's train JSON and check every image again (data/cache.py).
    data_cache: str = option(
        "auto",
        "where train and eval cache the parsed annotations and the data check's verdicts for the next "
        "start: auto (OUTPUT_DIR/cache), off, or a folder",
        check=cache_folder_problem,
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

    # The training forward of the RPN and the RoI heads (modeling/batched/): batched over the images with
    # fixed-size tensors, a few host waits a step whatever the batch; or torchvision's, image by image.
    # The same parameters and checkpoints either way; evaluation is torchvision's in both.
    heads: str = option(
        "batched",
        "batched (the RPN and RoI heads' training step on the whole batch at once, a few host waits a step) "
        "or torchvision (image by image, torchvision's own code)",
        choices=HEADS,
    )
    # torchvision's box_batch_size_per_image (detectron2's ROI_HEADS.BATCH_SIZE_PER_IMAGE): a training
    # step's box and mask losses read this many of each image's proposals, a quarter at most positive,
    # and the positives go through the mask head. Training steps only: evaluation and the state dict are
    # the same at any value.
    box_batch_size_per_image: int | None = option(
        None,
        "proposals sampled per image for the box and mask heads' training losses, at most a quarter of them "
        "positive (default: the model's own, 512; 128 for maskrcnn_resnet18_fpn)",
        minimum=1,
    )
    # torchvision's box_detections_per_img (detectron2's TEST.DETECTIONS_PER_IMAGE): the most detections
    # an image keeps at inference, best scores first, each one through the mask head. COCO's AP counts up
    # to 100 an image; LVIS's up to 300. Evaluation, predict and the exports keep it; training does not
    # read it.
    detections_per_image: int | None = option(
        None,
        "most detections kept per image by evaluation, predict and the exports, best scores first "
        "(default: the model's own, 100)",
        minimum=1,
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

    # At least a second: the store's first connection and a group's bootstrap bound by it take that long on a
    # busy host, and a bound below it fails a healthy start deep inside torch's rendezvous.
    timeout: float = option(
        120.0,
        "seconds before a silent peer counts as lost (RPC and process-group timeouts)",
        flag="rpc-timeout",
        minimum=1,
    )
    # Off by default: an elastic group adds a heartbeat thread and one store round trip per step.
    elastic: bool = option(
        False,
        "ddp: a lost or drained worker leaves and the others train on; a replacement rejoins (docs/elastic.md)",
    )
    # torchft's Manager takes the same rule (min_replica_size): below it the survivors hold, state saved.
    elastic_min_size: int = option(
        1,
        "--elastic: the fewest members that train on; with fewer, they hold at the step boundary (checkpoint "
        "written) and wait --elastic-min-wait for replacements, then stop (exit 75)",
        minimum=1,
    )
    elastic_min_wait: float = option(
        300.0, "--elastic: seconds a group below --elastic-min-size waits for replacements before it stops", above=0
    )
    # torch's own bound on forming the group is 30 minutes.
    join_timeout: float = option(
        600.0,
        "pipeline: seconds to wait for every process to join RPC before exiting non-zero",
        above=0,
        engines=("pipeline",),
    )

    def elastic_rules_set(self) -> bool:
        """Whether an elastic group's rules (--elastic-min-size, --elastic-min-wait) differ from their defaults."""
        default = PeersConfig()
        return (self.elastic_min_size, self.elastic_min_wait) != (default.elastic_min_size, default.elastic_min_wait)


@dataclass
class PipelineConfig:
    micro_batches: int = option(
        2, "pipeline: micro-batches per batch (at most --batch-size)", minimum=1, maximum=4096, engines=("pipeline",)
    )
    # engines/pipeline/schedule.py; the default by bench_pipeline.py's measurement (docs/performance-pipeline.md).
    schedule: str = option(
        "1f1b",
        "pipeline: the order of each stage's forwards and backwards: 1f1b (at most as many micro-batches in flight "
        "per stage as there are stages) or gpipe (every forward, then every backward)",
        choices=PIPELINE_SCHEDULES,
        flag="pipeline-schedule",
        engines=("pipeline",),
    )
    # Send stage-1 features to stage 2 in bfloat16: half the bytes on the wire.
    bf16_transport: bool = option(False, "pipeline: send features in bfloat16", engines=("pipeline",))
