"""The best checkpoint and early stopping: what each evaluation of a training run decides.

Every evaluation gives one value of `--best-metric` (a COCO AP: higher is better). A strictly higher
value than the best so far is a new best: the evaluation hook (hooks.py) makes the step's checkpoint
checkpoints/best.pt (checkpoint.publish_best) with a `best` record in metrics.jsonl. An evaluation that
does not beat the best counts towards `--patience`; N of them in a row end training. The first
evaluation of a run is always a new best.

Every process of a run holds the same `BestTracker`: the metric is computed on rank 0 only (evaluation
gathers the detections there), so its value is shared with one all-reduce (`agreed_value`) before any
process decides, and every rank stops at the same evaluation. The tracker's state is part of every
checkpoint, so a resumed run keeps its best and its patience count.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..checkpoint import publish_best, read_torch_file
from ..errors import CheckpointError, ConfigError
from ..evaluation import METRIC_KEYS
from ..run_dir import BEST_CHECKPOINT, CHECKPOINT_DIR

log = logging.getLogger(__name__)


def check_best_metric(name: str) -> None:
    """`--best-metric` must be a metric the evaluation writes (known before the first one runs)."""
    if name not in METRIC_KEYS:
        raise ConfigError(
            f"--best-metric {name!r} is not a metric the evaluation writes; choose one of {', '.join(METRIC_KEYS)}"
        )


def agreed_value(
    metrics: dict[str, float] | None, metric: str, all_reduce_sum: Callable[[torch.Tensor], torch.Tensor]
) -> float:
    """`metrics[metric]` of the process that has the metrics (rank 0; the others have None), on every
    process: a sum over ranks where only rank 0 contributes. Every rank calls it once per evaluation."""
    mine = torch.tensor([metrics[metric] if metrics is not None else 0.0], dtype=torch.float64)
    return float(all_reduce_sum(mine)[0])


@dataclass
class BestTracker:
    """The best value of `metric` so far, at which step, and how many evaluations since then."""

    metric: str
    patience: int | None = None
    value: float | None = None
    step: int | None = None
    since: int = 0  # evaluations since the best, which did not beat it

    def update(self, value: float, step: int) -> bool:
        """Judge one evaluation; True when it is a new best."""
        if not math.isfinite(value):
            raise ValueError(f"{self.metric} at step {step} is {value}")
        if self.value is None or value > self.value:  # strictly: a tie keeps the earlier checkpoint
            self.value, self.step, self.since = value, step, 0
            return True
        self.since += 1
        return False

    @property
    def exhausted(self) -> bool:
        """`patience` evaluations in a row without a new best: training ends."""
        return self.patience is not None and self.since >= self.patience

    def record(self) -> dict[str, Any]:
        """The `best` record of metrics.jsonl (the step is the record's own; the file is OUTPUT_DIR's)."""
        return {"metric": self.metric, "value": self.value, "checkpoint": f"{CHECKPOINT_DIR}/{BEST_CHECKPOINT}"}

    def closing_line(self) -> str:
        return (
            f"early stop: {self.metric} has not improved for {self.since} evaluations (--patience {self.patience}); "
            f"best {self.metric} {self.value:.4f} at step {self.step}, in {BEST_CHECKPOINT}"
        )

    def to_state(self) -> dict[str, Any]:
        return {"metric": self.metric, "value": self.value, "step": self.step, "since": self.since}

    def restore(self, state: Any, source: Path | str) -> None:
        """Continue from a checkpoint's state. A checkpoint written before best checkpoints existed, or
        for another --best-metric, has no best of this metric: the next evaluation starts afresh."""
        if not isinstance(state, dict) or state.get("metric") != self.metric:
            why = "no best-checkpoint state" if not isinstance(state, dict) else f"its best is by {state.get('metric')}"
            log.info("checkpoint %s: %s; the best %s starts afresh", source, why, self.metric)
            return
        self.value, self.step, self.since = state["value"], state["step"], int(state["since"])


def restore_best_file(tracker: BestTracker, checkpoint: Path, step: int) -> None:
    """Resuming from `checkpoint` (at `step`): when it is the best one and best.pt is not (the process
    died between writing the checkpoint and publishing it), publish it now. Main process only."""
    if tracker.step != step:
        return
    best = Path(checkpoint).parent / BEST_CHECKPOINT
    if best.is_file() and Path(checkpoint).samefile(best):
        return
    if best.is_file():
        try:
            if read_torch_file(best, "best checkpoint", CheckpointError).get("step") == step:
                return
        except CheckpointError:
            pass  # a torn best.pt is replaced below
    log.info("%s holds the best %s (%.4f): publishing it as %s", checkpoint, tracker.metric, tracker.value, best.name)
    publish_best(Path(checkpoint))
