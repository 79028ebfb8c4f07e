"""The trained model: everything that rebuilds a run's model exactly, recorded in every checkpoint and
read back by every tool that uses the model (eval --resume, predict, export, report --gallery, and
fine-tuning with --weights of a kit checkpoint): one record, one way back to a config.

A checkpoint holds it under `trained_model` (plain types, so `weights_only=True` still loads it):

    settings        the model flags as trained (--model, --min-size, ..., --backbone-norm resolved)
    exif_orientation the rule the run read its images' orientation by (data/images/orientation.py)
    data_flags      the data flags the run found its dataset by (config.DATA_SOURCE_FLAGS, and the
                    --seed that carved a --val-fraction split): what eval, export and the gallery reuse
    data            the splits it trained and validated on (data/sources/__init__.py's DataSources)
    torchvision     what torchvision alone needs: the backbone, the BatchNorm kind and every MaskRCNN
                    keyword argument (RPN and box settings included; docs/predict-and-report.md)

and the classes under `categories` (categories.py), as before. Checkpoints written before this record
existed are read from the config they recorded.

Flags given on the command line (or in a YAML file) win over the record, each with one logged line; a
flag that cannot work with these weights (another --model) is an error naming the flags.
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchvision.models.detection import MaskRCNN

from ..categories import Categories
from ..checkpoint import checkpoint_file, load_checkpoint, read_torch_file, resolve_resume
from ..config import (
    BY_FLAG,
    DATA_PATH_FLAGS,
    DATA_SOURCE_FLAGS,
    FIELDS,
    ModelConfig,
    TrainConfig,
    build_config,
    config_to_dict,
    load_yaml_config,
)
from ..data.sources import DataSources
from ..errors import CheckpointError, ConfigError, UserError, WeightsError
from .model import CLASS_SCORE_WEIGHT, builder_kwargs, state_num_classes, torchvision_weights_hint
from .perf import CHANNELS_LAST_MODULES

log = logging.getLogger(__name__)

TRAINED_MODEL_KEY = "trained_model"
# The model flags that shape the model; the weight files were only its starting point.
SETTING_FLAGS = tuple(
    spec.flag for spec in FIELDS if spec.section == "model" and spec.name not in ("weights", "weights_backbone")
)
# torchvision's backbone of each builder ("maskrcnn_resnet18_fpn" is the kit's: torchvision's parts).
TORCHVISION_BACKBONES = {
    "maskrcnn_resnet50_fpn": "resnet50",
    "maskrcnn_resnet50_fpn_v2": "resnet50",
    "maskrcnn_resnet18_fpn": "resnet18",
}


@dataclass(frozen=True)
class TrainedModel:
    """A run's model as trained: what `trained_model` in its checkpoint holds, and its categories."""

    settings: Mapping[str, Any]  # model flag -> value (SETTING_FLAGS)
    exif_orientation: str
    num_classes: int  # background included
    categories: Categories | None = None  # None in files written before checkpoints carried them
    data_flags: Mapping[str, Any] = field(default_factory=dict)  # flag -> value; empty: none recorded
    data: DataSources | None = None

    @classmethod
    def of_run(cls, cfg: TrainConfig, categories: Categories, data: DataSources | None) -> TrainedModel:
        saved = config_to_dict(cfg)
        return cls(
            saved_model_flags(saved),
            cfg.data.exif_orientation,
            categories.num_classes,
            categories,
            _absolute_paths(saved_data_flags(saved)),
            data,
        )

    def model_config(self) -> ModelConfig:
        cfg = TrainConfig()
        for flag, value in self.settings.items():
            BY_FLAG[flag].set(cfg, BY_FLAG[flag].parse(value))
        return cfg.model

    def torchvision_record(self) -> dict[str, Any]:
        """What torchvision's own builders need to rebuild this model (docs/predict-and-report.md)."""
        model = self.model_config()
        return {
            "builder": model.name,
            "backbone": TORCHVISION_BACKBONES[model.name],
            "frozen_batchnorm": model.resolved_backbone_norm() == "frozen",
            "kwargs": every_setting(builder_kwargs(model, self.num_classes)),
            # The modules the kit holds in channels_last: the same layout gives the same numbers.
            "channels_last": list(CHANNELS_LAST_MODULES) if model.channels_last else [],
        }

    def to_record(self) -> dict[str, Any]:
        return {
            "settings": dict(self.settings),
            "exif_orientation": self.exif_orientation,
            "data_flags": dict(self.data_flags),
            "data": None if self.data is None else self.data.to_record(),
            "torchvision": self.torchvision_record(),
        }

    @classmethod
    def from_checkpoint(cls, state: Mapping[str, Any], source: str) -> TrainedModel:
        """The trained model of a checkpoint (a dict as load_checkpoint returns it); older checkpoints
        without `trained_model` from the config they recorded."""
        categories = Categories.from_state(state.get("categories"), source)
        num_classes = _num_classes(state.get("model"), categories, source)
        record = state.get(TRAINED_MODEL_KEY)
        if isinstance(record, Mapping):
            data = record.get("data")
            return cls(
                dict(record["settings"]),
                str(record["exif_orientation"]),
                num_classes,
                categories,
                dict(record.get("data_flags") or {}),
                None if data is None else DataSources.from_record(data),
            )
        saved = state.get("config") if isinstance(state.get("config"), Mapping) else {}
        trained_with = saved.get("data") if isinstance(saved.get("data"), Mapping) else {}
        orientation = str(trained_with.get("exif_orientation", "auto"))
        return cls(saved_model_flags(dict(saved)), orientation, num_classes, categories, saved_data_flags(dict(saved)))

    @classmethod
    def of_weights_file(cls, path: Path) -> TrainedModel | None:
        """The trained model of a --weights file that is a kit checkpoint; None for a plain state dict
        (torchvision's, or any other: the model flags describe it)."""
        state = read_torch_file(path, "weights", WeightsError)
        if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
            return None
        if TRAINED_MODEL_KEY not in state and "config" not in state:
            return None  # torchvision's reference scripts also save {"model": ...}: no settings recorded
        return cls.from_checkpoint(state, f"weights file {path}")

    def flags(self, given: Mapping[str, Any], reading: str, with_data: bool = False) -> dict[str, Any]:
        """The flags that rebuild this model (and, `with_data`, find its dataset), for build_config to put
        under `given` (the flags of the command line and YAML file). Each given flag that differs from
        the record is logged once; another --model is a ConfigError naming it and `reading` (the flag
        that names the checkpoint)."""
        base = {**self.settings, "exif-orientation": self.exif_orientation}
        # The recorded data only where no data flag is given: a --data-path beside recorded split flags
        # would be refused as a contradiction. Its --seed still carves the same --val-fraction split.
        if with_data and not any(given.get(flag) is not None for flag in DATA_SOURCE_FLAGS):
            base.update(self.data_flags)
        elif with_data and "seed" in self.data_flags:
            base["seed"] = self.data_flags["seed"]
        for flag, saved in base.items():
            if given.get(flag) is None:
                continue
            value = BY_FLAG[flag].parse(given[flag])
            if value == BY_FLAG[flag].parse(saved):
                continue
            if flag == "model":
                raise ConfigError(
                    f"--model {value} contradicts {reading}: its weights are a {saved}; leave --model out "
                    "(the checkpoint says which model it is) or give weights of that model"
                )
            log.info("--%s %s given: used instead of %s's %s", flag, value, reading, saved)
        return base


def every_setting(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """`kwargs` with every other number MaskRCNN takes (its size, RPN and box settings) at torchvision's
    default: a record that does not depend on torchvision keeping its defaults. (Its module arguments,
    None by default, stay out: maskrcnn_resnet50_fpn_v2 passes its own.)"""
    parameters = inspect.signature(MaskRCNN.__init__).parameters.values()
    numbers = {p.name: p.default for p in parameters if type(p.default) in (int, float)}
    return {**numbers, **kwargs}


def config_for(
    given: Mapping[str, Any],
    yaml_path: Path | None,
    trained: TrainedModel | None,
    reading: str,
    with_data: bool = False,
) -> TrainConfig:
    """The config of a command that uses `trained` (None: no checkpoint, the flags alone): its flags
    under the ones given. The one way from a checkpoint to a model's settings."""
    if trained is None:
        return build_config(yaml_path, dict(given))
    from_file = load_yaml_config(yaml_path) if yaml_path is not None else {}
    explicit = {**from_file, **{k: v for k, v in given.items() if v is not None}}
    base = trained.flags(explicit, reading, with_data=with_data)
    return build_config(yaml_path, dict(given), base=base)


def _num_classes(model_state: Any, categories: Categories | None, source: str) -> int:
    found = state_num_classes(model_state) if isinstance(model_state, Mapping) else None
    if found is None:
        raise CheckpointError(f"{source} is not a Mask R-CNN model: it has no {CLASS_SCORE_WEIGHT}")
    if categories is not None and categories.num_classes != found:
        raise CheckpointError(
            f"{source}: its categories name {categories.num_classes - 1} classes, its model has {found - 1}"
        )
    return found


def train_command_config(yaml_path: Path | None, given: Mapping[str, Any]) -> TrainConfig:
    """`train`'s and `eval`'s config: the flags alone, or, where they name a kit checkpoint to start
    from or evaluate (`eval --resume`, `--weights` of a checkpoint), its trained model under them.
    `eval` also finds the run's dataset there when no --data-path is given."""
    cfg = build_config(yaml_path, dict(given))
    try:
        found = _checkpoint_named(cfg)
    except UserError:
        # A file that cannot be read is train's to report, after the checks it makes first (the output
        # folder's): the flags alone get it there.
        return cfg
    if found is None:
        return cfg
    trained, reading = found
    return config_for(given, yaml_path, trained, reading, with_data=cfg.test_only)


def check_model_files(cfg: TrainConfig) -> None:
    """The checkpoint and weight files train's flags name exist, before any data is loaded or generated
    (their contents are read, and checked, where they are used); a name of torchvision's weights gets
    the way to their file."""
    named = [
        ("--resume", cfg.resume),
        ("--weights", cfg.model.weights),
        ("--weights-backbone", cfg.model.weights_backbone),
    ]
    for flag, path in named:
        if path is not None and str(path) not in ("auto", "best") and not Path(path).exists():
            backbone = flag == "--weights-backbone"
            hint = None if flag == "--resume" else torchvision_weights_hint(str(path), cfg.model, backbone)
            raise ConfigError(f"{flag} {path}: no such file" + (f"; {hint}" if hint else ""))
    if str(cfg.resume) == "best":
        resolve_resume(cfg.resume, cfg.output_dir)  # OUTPUT_DIR/checkpoints/best.pt must exist


def _checkpoint_named(cfg: TrainConfig) -> tuple[TrainedModel, str] | None:
    """The trained model the flags name, and the flag that names it."""
    if cfg.test_only and cfg.resume is not None:
        path = checkpoint_file(resolve_resume(cfg.resume, cfg.output_dir, must_exist=True))
        return TrainedModel.from_checkpoint(load_checkpoint(path), f"checkpoint {path}"), f"--resume {cfg.resume}"
    weights = cfg.model.weights
    if weights is None or not Path(weights).is_file():
        return None
    trained = TrainedModel.of_weights_file(Path(weights))
    return None if trained is None else (trained, f"--weights {weights}")


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


def _absolute_paths(flags: dict[str, Any]) -> dict[str, Any]:
    """The data flags with their paths made absolute: a relative one meant the training run's working
    directory, and `eval --resume` or `predict` may run from another (symlinks kept, as given)."""
    return {f: os.path.abspath(v) if f in DATA_PATH_FLAGS and isinstance(v, str) else v for f, v in flags.items()}
