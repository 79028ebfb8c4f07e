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

An elastic member (training/elastic_loop.py) writes its line before the step, to its launch rank's
file, and at every new generation the lines after the committed position are dropped from every
file (`drop_after`): a member killed at any instant leaves each committed step's images once.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Protocol, TextIO

from ..errors import one_line
from ..run_dir import SAMPLES_DIR
from .base import Boundary, HookBase, Start
from .losses import Samples, StepResult
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
        self._unwritable = False  # warned once; the run goes on without this rank's record

    def before_train(self, start: Start) -> None:
        if self.is_main and start.resumed_from is not None:
            self.drop_after(start.step, every_rank=True)

    def after_step(self, at: Boundary, result: StepResult) -> None:
        if result.samples is not None:
            self.record(at.step, result.samples)

    def record(self, step: int, samples: Samples) -> None:
        """This rank's line of `step` (optimizer steps done once it is committed)."""
        if self._unwritable:
            return
        if self._file is None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = open(self.path, "a", buffering=1)
            except OSError as exc:  # a worker pod's read-only mount of the run folder (the chart's default)
                self._unwritable = True
                log.warning(
                    "%s: cannot write this rank's sample record (%s): training goes on without it; every pod "
                    "writes it where the run folder is writable on each (the chart's storage.workerMount=readWrite)",
                    self.path,
                    one_line(exc),
                )
                return
        line = {
            "step": step,
            "epoch": samples.epoch,
            "batch": samples.batch,
            "rank": samples.rank,
            "world_size": samples.world_size,
            "image_ids": [self.image_ids[i] for i in samples.indices],
        }
        self._file.write(json.dumps(line) + "\n")

    def drop_after(self, step: int, every_rank: bool) -> None:
        """Drop the lines after `step` from this rank's file (and from every rank's file in the folder
        when `every_rank`: a resume's, and an elastic leader's for members that are gone). Files are
        replaced: this one is reopened at its next write."""
        self._close()
        if self._unwritable:
            return
        paths = sorted(self.path.parent.glob("rank*.jsonl")) if every_rank else [self.path]
        for path in paths:
            if path.exists() and (dropped := drop_lines_after(path, step)):
                log.info("%s: dropped %d line(s) of steps after %d", path, dropped, step)

    def after_train(self) -> None:
        self._close()

    def _close(self) -> None:
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
