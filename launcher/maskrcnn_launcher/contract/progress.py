"""The trainer's console progress line: the trainer writes it, `status` reads it back from the pod's log."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "MEMBERSHIP_EVENTS",
    "PROGRESS_BAR_WIDTH",
    "PROGRESS_KINDS",
    "format_membership_line",
    "format_progress_bar",
    "format_progress_line",
    "parse_membership_line",
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
    """`name value` pairs of the float values shown on the console, each value `.4g`, then `world N`
    when the record carries its world size (an elastic ddp job's changes as it goes).

    Names with a "/" are engine extras ("link/...", "stage1/..."): they go to the metrics file and
    TensorBoard, not the console. Other ints (epoch) and lists are left out too."""
    shown = [f"{k} {v:.4g}" for k, v in values.items() if isinstance(v, float) and "/" not in k]
    if isinstance(values.get("world_size"), int):
        shown.append(f"world {values['world_size']}")
    return " ".join(shown)


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


# An elastic ddp job's changes of membership, as its leader (the master's process) logs them:
# `elastic: rank 2 lost after step 12; world size 2`. `status` counts them in the master's log tail.
MEMBERSHIP_EVENTS = ("lost", "left", "joined")
_MEMBERSHIP_LINE = re.compile(
    rf"\belastic: rank (?P<rank>\d+) (?P<event>{'|'.join(MEMBERSHIP_EVENTS)}) after step (?P<step>\d+); "
    r"world size (?P<world>\d+)"
)


def format_membership_line(event: str, rank: int, step: int, world_size: int) -> str:
    """One change of an elastic group: `rank` (a launch rank) `event` after `step` finished steps."""
    if event not in MEMBERSHIP_EVENTS:
        raise ValueError(f"membership event {event!r} is not one of {', '.join(MEMBERSHIP_EVENTS)}")
    return f"elastic: rank {rank} {event} after step {step}; world size {world_size}"


def parse_membership_line(line: str) -> dict[str, Any] | None:
    """{"event", "rank", "step", "world_size"} from a line format_membership_line wrote; None otherwise."""
    match = _MEMBERSHIP_LINE.search(line)
    if match is None:
        return None
    return {
        "event": match["event"],
        "rank": int(match["rank"]),
        "step": int(match["step"]),
        "world_size": int(match["world"]),
    }
