"""The trainer's console progress line: the trainer writes it, `status` reads it back from the pod's log."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "PROGRESS_BAR_WIDTH",
    "PROGRESS_KINDS",
    "format_progress_bar",
    "format_progress_line",
    "parse_progress_line",
    "progress_values",
]

# Plain `<kind> step <step>/<total> <name> <value> ...`, or the terminal bar `[###...] <step>/<total> ...`
# (a bar is always a train step). Searched, not anchored: log collectors may prefix the line.
PROGRESS_KINDS = ("train", "val", "eval")
PROGRESS_BAR_WIDTH = 30
_PROGRESS_LINE = re.compile(
    rf"(?:\b(?P<kind>{'|'.join(PROGRESS_KINDS)}) step |\[[#.]+\] )(?P<step>\d+)/(?P<total>\d+)(?P<rest>.*)"
)


def progress_values(values: Mapping[str, Any]) -> str:
    """`name value` pairs of the float values shown on the console, each value `.4g`.

    Names with a "/" are engine extras ("link/...", "stage1/..."): they go to the metrics file and
    TensorBoard, not the console. Ints (epoch) and lists are left out too."""
    return " ".join(f"{k} {v:.4g}" for k, v in values.items() if isinstance(v, float) and "/" not in k)


def format_progress_line(kind: str, step: int, total: int, values: Mapping[str, Any]) -> str:
    """One plain progress line (no newline), what pods and CI logs show: `train step 20/150 loss 1.2 ...`."""
    shown = progress_values(values)
    return f"{kind} step {step}/{total}" + (f" {shown}" if shown else "")


def format_progress_bar(step: int, total: int, values: Mapping[str, Any], width: int = PROGRESS_BAR_WIDTH) -> str:
    """The terminal's one-line train progress bar (no carriage return): `[#####.....] 20/150 loss 1.2 ...`."""
    done = int(width * step / max(1, total))
    shown = progress_values(values)
    return f"[{'#' * done}{'.' * (width - done)}] {step}/{total}" + (f" {shown}" if shown else "")


def parse_progress_line(line: str) -> dict[str, Any] | None:
    """Read back one console line of the trainer: {"kind", "step", "total", <name>: float, ...}.

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
