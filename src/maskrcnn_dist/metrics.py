"""Metrics: JSON lines (the record other tools read), TensorBoard scalars, and console progress.

Only the main process writes. On a terminal the console shows a one-line progress bar; elsewhere
(pods, CI) plain log lines every `print_freq` steps, because a bar's carriage returns make
`kubectl logs` unreadable.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any, TextIO

METRICS_FILE = "metrics.jsonl"

# The console line `MetricsWriter._console` writes, as `parse_progress_line` reads it back: plain
# `<kind> step <step>/<total> <name> <value> ...`, or the terminal bar `[###...] <step>/<total> ...`
# (a bar is always a train step). Searched, not anchored: log collectors may prefix the line.
_PROGRESS_LINE = re.compile(r"(?:\b(?P<kind>train|val|eval) step |\[[#.]+\] )(?P<step>\d+)/(?P<total>\d+)(?P<rest>.*)")


class MetricsWriter:
    def __init__(
        self,
        output_dir: Path,
        enabled: bool,
        total_steps: int,
        print_freq: int,
        stream: TextIO | None = None,
        tensorboard: bool = True,
    ) -> None:
        self.enabled = enabled
        self.total_steps = total_steps
        self.print_freq = max(1, print_freq)
        self.stream = stream or sys.stdout
        self.interactive = self.stream.isatty()
        self._tb = None
        self._jsonl = None
        if enabled:
            output_dir = Path(output_dir)
            output_dir.mkdir(parents=True, exist_ok=True)
            self._jsonl = open(output_dir / METRICS_FILE, "a", buffering=1)
            if tensorboard:
                from torch.utils.tensorboard import SummaryWriter  # heavy import: only where used

                self._tb = SummaryWriter(str(output_dir / "tensorboard"))

    def write(self, kind: str, step: int, values: dict[str, Any]) -> None:
        """Record one event: kind is 'train', 'val' or 'eval'; values are floats or small lists."""
        if not self.enabled:
            return
        record = {"kind": kind, "step": step, "time": round(time.time(), 3), **values}
        self._jsonl.write(json.dumps(record) + "\n")
        if self._tb is not None:
            for key, value in values.items():
                if isinstance(value, (int, float)):
                    self._tb.add_scalar(f"{kind}/{key}", value, step)
        self._console(kind, step, values)

    def _console(self, kind: str, step: int, values: dict[str, Any]) -> None:
        # Engine extras ("link/...", "stage1/...") go to the JSON lines and TensorBoard, not the console.
        shown = " ".join(f"{k} {v:.4g}" for k, v in values.items() if isinstance(v, float) and "/" not in k)
        if kind == "train":
            if self.interactive:
                done = int(30 * step / max(1, self.total_steps))
                bar = "#" * done + "." * (30 - done)
                self.stream.write(f"\r[{bar}] {step}/{self.total_steps} {shown}")
                self.stream.flush()
                return
            if step % self.print_freq and step != self.total_steps:
                return
        prefix = "\n" if self.interactive else ""
        self.stream.write(f"{prefix}{kind} step {step}/{self.total_steps} {shown}\n")
        self.stream.flush()

    def close(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
        if self._tb is not None:
            self._tb.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All records of a metrics file; a torn last line (the writer was killed) is ignored."""
    records = []
    for line in Path(path).read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def parse_progress_line(line: str) -> dict[str, Any] | None:
    """Read back one console line of `MetricsWriter`: {"kind", "step", "total", <name>: float, ...}.

    None when the line is not one (log lines of other modules, tracebacks). Values printed with
    `.4g` ("1e-05", "nan", "inf") read back as floats; a token that is not a number is skipped
    rather than failing the line, so a `kubectl logs` tail with a torn line still parses.
    """
    match = _PROGRESS_LINE.search(line)
    if match is None:
        return None
    parsed: dict[str, Any] = {
        "kind": match["kind"] or "train",
        "step": int(match["step"]),
        "total": int(match["total"]),
    }
    tokens = match["rest"].split()
    for name, value in zip(tokens[::2], tokens[1::2]):
        try:
            parsed[name] = float(value)
        except ValueError:
            continue
    return parsed
