"""The sample record: which images each rank trained on at each step, in the run folder.

Every data-parallel rank appends to its own file, samples/rank<r>.jsonl (run_dir.samples_path), one line
per step, written after the step and with no collective:

    {"step": 7, "epoch": 1, "batch": 3, "rank": 0, "world_size": 2, "image_ids": [139, 285]}

`step` counts optimizer steps done (the train record's step); `batch` is the global batch of `epoch`
(data/plan.py); `image_ids` are the dataset's image ids the rank gave a loss weight (a filler that only
keeps ranks in step is left out). On resume the main process drops every rank file's lines after the
checkpoint's step (those steps are trained again) before the first step, whose collectives keep the
other ranks from writing before it; a file is opened at its first write, after that. So for any
epoch the union of the lines is the epoch's images, each once, at whatever world sizes it ran.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Protocol, TextIO

from ..run_dir import SAMPLES_DIR
from .loop import Boundary, HookBase, Start, StepResult
from .metrics import drop_lines_after

log = logging.getLogger(__name__)


class HasImageIds(Protocol):
    @property
    def image_ids(self) -> list[int]:
        """Dataset index i -> its image id."""
        ...


class SampleRecordHook(HookBase):
    """Appends this rank's line of every step to `path`, naming images by `dataset`'s ids."""

    name = "samples"

    def __init__(self, path: Path, dataset: HasImageIds, is_main: bool) -> None:
        self.path, self.image_ids, self.is_main = Path(path), dataset.image_ids, is_main
        self._file: TextIO | None = None

    def before_train(self, start: Start) -> None:
        if self.is_main and start.resumed_from is not None:
            for path in sorted(self.path.parent.glob("rank*.jsonl")):
                if dropped := drop_lines_after(path, start.step):
                    log.info("%s: dropped %d line(s) after step %d", path, dropped, start.step)

    def after_step(self, at: Boundary, result: StepResult) -> None:
        samples = result.samples
        if samples is None:
            return
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", buffering=1)
        line = {
            "step": at.step,
            "epoch": samples.epoch,
            "batch": samples.batch,
            "rank": samples.rank,
            "world_size": samples.world_size,
            "image_ids": [self.image_ids[i] for i in samples.indices],
        }
        self._file.write(json.dumps(line) + "\n")

    def after_train(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_samples(output_dir: Path) -> list[dict[str, Any]]:
    """Every rank's lines of a run folder's sample record, by step then rank."""
    lines = [
        json.loads(line)
        for path in sorted((Path(output_dir) / SAMPLES_DIR).glob("rank*.jsonl"))
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]
    return sorted(lines, key=lambda record: (record["step"], record["rank"]))
