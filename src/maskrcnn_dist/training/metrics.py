"""Metrics: JSON lines (the record other tools read), TensorBoard scalars, console progress, and sinks.

Only the main process writes. A sink (`MetricsSink`) sees every record too: under Kubeflow Trainer with
its status endpoint configured, the composition root (train.py) adds `progress_post.ProgressPoster`,
which turns them into the TrainJob's status; the loop and the hooks know nothing of it. On a terminal
the console shows a one-line progress bar; elsewhere (pods, CI) plain log lines every `print_freq`
steps, because a bar's carriage returns make `kubectl logs` unreadable.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TextIO

# The console line's format is the pod contract's: `maskrcnn-launch status` reads it back from a
# pod's log. `parse_progress_line` is re-exported for the trainer's own readers.
from maskrcnn_launcher.contract import format_progress_bar, format_progress_line
from maskrcnn_launcher.contract import parse_progress_line as parse_progress_line

from ..errors import UserError
from ..run_dir import METRICS_FILE, TENSORBOARD_DIR


class MetricsSink(Protocol):
    """Something else that wants every metrics record, as it is written."""

    def record(self, kind: str, step: int, values: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...


class MetricsWriter:
    def __init__(
        self,
        output_dir: Path,
        enabled: bool,
        total_steps: int,
        print_freq: int,
        stream: TextIO | None = None,
        tensorboard: bool = True,
        sinks: Sequence[MetricsSink] = (),
    ) -> None:
        """`sinks`: what else sees every record (the composition root chooses them: train.py)."""
        self.enabled = enabled
        self.total_steps = total_steps
        self.print_freq = max(1, print_freq)
        self.stream = stream or sys.stdout
        self.interactive = self.stream.isatty()
        self._tb = None
        self._jsonl = None
        self.path = Path(output_dir) / METRICS_FILE
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._jsonl = open(self.path, "a", buffering=1)
            if tensorboard:
                from torch.utils.tensorboard import SummaryWriter  # heavy import: only where used

                self._tb = SummaryWriter(str(output_dir / TENSORBOARD_DIR))
        self.sinks = list(sinks) if enabled else []

    def write(self, kind: str, step: int, values: dict[str, Any]) -> None:
        """Record one event: kind is 'train', 'val' or 'eval'; values are floats or small lists."""
        if not self.enabled:
            return
        record = {"kind": kind, "step": step, "time": round(time.time(), 3), **values}
        self._jsonl.write(json.dumps(strict_json(record), allow_nan=False) + "\n")
        if self._tb is not None:
            for key, value in values.items():
                if isinstance(value, (int, float)):
                    self._tb.add_scalar(f"{kind}/{key}", value, step)
        self._console(kind, step, values)
        for sink in self.sinks:
            sink.record(kind, step, values)

    def truncate_after(self, step: int) -> int:
        """Drop the records of steps after `step` (and a torn last line): a resumed run re-runs them, and
        readers must see one record per step. Returns how many went."""
        if not self.enabled or not self.path.is_file():
            return 0
        self._jsonl.close()
        dropped = drop_lines_after(self.path, step)
        self._jsonl = open(self.path, "a", buffering=1)
        return dropped

    def _console(self, kind: str, step: int, values: dict[str, Any]) -> None:
        # Engine extras ("link/...", "stage1/...") go to the JSON lines and TensorBoard, not the console
        # (the contract's formatters leave them out).
        if kind == "train":
            if self.interactive:
                self.stream.write("\r" + format_progress_bar(step, self.total_steps, values))
                self.stream.flush()
                return
            if step % self.print_freq and step != self.total_steps:
                return
        prefix = "\n" if self.interactive else ""
        self.stream.write(f"{prefix}{format_progress_line(kind, step, self.total_steps, values)}\n")
        self.stream.flush()

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
        if self._jsonl is not None:
            self._jsonl.close()
        if self._tb is not None:
            self._tb.close()


def non_finite(values: Mapping[str, Any]) -> dict[str, float]:
    """The float values of `values` that are NaN or infinite."""
    return {k: v for k, v in values.items() if isinstance(v, float) and not math.isfinite(v)}


def strict_json(record: Mapping[str, Any]) -> dict[str, Any]:
    """`record` as strict JSON takes it: JSON has no NaN or Infinity (Python writes them as bare tokens that
    JavaScript's and Go's parsers reject), so a non-finite value is null, and `non_finite` says what it was."""
    bad = non_finite(record)
    if not bad:
        return dict(record)
    return {
        **{k: (None if k in bad else v) for k, v in record.items()},
        "non_finite": {k: str(v) for k, v in bad.items()},
    }


def drop_lines_after(path: Path, step: int) -> int:
    """Drop the JSON lines of `path` whose "step" is after `step`, and a torn last line (a writer killed
    mid-line). Lines that carry no step are not ours to judge and stay. The file is replaced
    atomically (a writer must reopen it); returns how many lines went."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:  # rewriting it would lose whatever it holds: stop instead
        raise UserError(
            f"{path} is not a text file ({exc.reason} at byte {exc.start}): the resumed run cannot "
            "append to it; move it away or train into another --output-dir"
        ) from None
    torn = lines[-1:] if lines and not _is_json(lines[-1]) else []
    kept = [line for line in lines[: len(lines) - len(torn)] if (_step_of(line) or 0) <= step]
    if len(kept) == len(lines):
        return 0
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text("".join(line + "\n" for line in kept))
    os.replace(tmp, path)
    return len(lines) - len(kept)


def _is_json(line: str) -> bool:
    try:
        json.loads(line)
    except json.JSONDecodeError:
        return False
    return True


def _step_of(line: str) -> int | None:
    """The step of one metrics line; None for a torn or foreign line."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    step = record.get("step") if isinstance(record, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All records of a metrics file; a torn last line (the writer was killed) is ignored."""
    records = []
    for line in Path(path).read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records
