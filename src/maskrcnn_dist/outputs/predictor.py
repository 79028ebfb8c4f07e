"""A trained model ready to predict, rebuilt from a checkpoint (--resume) or a weights file (--weights) the
way `eval` gets it (modeling/trained.py, the local engine), with what its labels mean, and the data flags
that name the split it trained on."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..categories import Categories
from ..checkpoint import load_checkpoint, resolve_resume
from ..config import DATA_SOURCE_FLAGS, TrainConfig, build_config
from ..data import CocoInstanceDataset
from ..engines.torch_engine import TorchEngine
from ..errors import CheckpointError, ConfigError, DatasetError, one_line
from ..modeling.model import CLASS_SCORE_WEIGHT, read_state_dict, state_num_classes
from ..modeling.perf import setup_process
from ..modeling.trained import TrainedModel, config_for


@dataclass
class Predictor:
    """A model ready to predict, with what its labels mean."""

    engine: TorchEngine
    categories: Categories  # the checkpoint's, or "class k" by index
    source: str  # "checkpoint PATH" / "weights file PATH": how messages name it
    trained: TrainedModel | None  # what the checkpoint records of the model (None for plain weights files)
    step: int | None = None  # the checkpoint's optimizer steps

    def predict(self, images: list[torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        return self.engine.predict(images)

    def categories_for(self, dataset: CocoInstanceDataset | None) -> Categories:
        """The dataset's categories (real COCO ids) when there is one, which must be as many as the model's."""
        if dataset is None:
            return self.categories
        theirs = Categories.of_dataset(dataset)
        if theirs.num_classes != self.categories.num_classes:
            raise DatasetError(
                f"{dataset.annotation_file}: {theirs.num_classes - 1} categories, but {self.source} "
                f"was trained for {self.categories.num_classes - 1}"
            )
        return theirs

    def trained_data_flags(self) -> dict[str, Any]:
        """The data flags the checkpoint's run found its dataset by (and its --seed); empty where it
        records none (a plain weights file)."""
        return dict(self.trained.data_flags) if self.trained is not None else {}


def load_predictor(flags: dict[str, Any], command: str = "predict") -> Predictor:
    """The model of `flags["resume"]` (a checkpoint; "auto" and "best" name one of the run in
    flags["output-dir"]) or `flags["weights"]` (a state dict, or a kit checkpoint), rebuilt from what it
    records (modeling/trained.py) with the train flags in `flags` over it."""
    resume, weights = flags.get("resume"), flags.get("weights")
    if (resume is None) == (weights is None):
        raise ConfigError(f"{command} needs one of --resume CHECKPOINT or --weights FILE")
    if resume is not None:
        resume = resolve_resume(resume, flags.get("output-dir") or TrainConfig().output_dir, must_exist=True)
        flags = {**flags, "resume": resume}
        source, reading = f"checkpoint {resume}", f"--resume {resume}"
        state = load_checkpoint(Path(resume))
        model_state, step = state["model"], state.get("step")
        trained: TrainedModel | None = TrainedModel.from_checkpoint(state, source)
    else:
        source, reading = f"weights file {weights}", f"--weights {weights}"
        model_state, step = read_state_dict(Path(weights), "weights"), None
        trained = TrainedModel.of_weights_file(Path(weights))
    num_classes = state_num_classes(model_state)
    if num_classes is None:
        raise CheckpointError(f"{source} is not a Mask R-CNN model: it has no {CLASS_SCORE_WEIGHT}")
    cfg = config_for(flags, None, trained, reading)
    setup_process(cfg)  # --threads and denormal flushing, as for eval
    # With --weights, build_model loads the file (eval's path); its class count is the file's, so nothing is skipped.
    engine = TorchEngine(cfg, num_classes, iters_per_epoch=1)
    if resume is not None:
        try:
            engine.load_state_dict({"model": model_state})
        except (KeyError, RuntimeError, ValueError) as exc:
            raise CheckpointError(f"{source} does not fit the model {cfg.model.name}: {one_line(exc)}") from exc
    categories = trained.categories if trained is not None else None
    return Predictor(engine, categories or Categories.by_index(num_classes), source, trained, step)


def data_config(
    flags: dict[str, Any], predictor: Predictor, exif_orientation: str, *, default_to_checkpoint: bool
) -> TrainConfig | None:
    """A config naming the dataset to read: the data flags given (a carve's --seed defaulting to the
    checkpoint's, so a --val-fraction split is the one it trained with), else, with
    `default_to_checkpoint`, the data the checkpoint was trained on; None when neither names one."""
    saved = predictor.trained_data_flags()
    given = {flag: flags[flag] for flag in (*DATA_SOURCE_FLAGS, "seed") if flags.get(flag) is not None}
    if not any(flag in given for flag in DATA_SOURCE_FLAGS):
        if not default_to_checkpoint or not saved:
            return None
        given = {**saved, **given}
    elif "seed" in saved:
        given.setdefault("seed", saved["seed"])
    return build_config(None, {**given, "exif-orientation": exif_orientation})
