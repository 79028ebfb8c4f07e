"""What the benchmarks share: timing a call, tables, the report, the host, and process trees.

Figures are compared only within one run. `seconds_per_call` is the one way a repeated call is timed:
warm-up calls first, then the median (or another statistic) of the rest, the device synchronised
around each call so that asynchronous GPU work is inside its own time. A benchmark imports this as a
sibling (`import common`, its folder is first on sys.path); the GPU check as `benchmarks.common`.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

Statistic = Callable[[Sequence[float]], float]


def seconds_per_call(
    work: Callable[[], Any],
    repeats: int,
    warmup: int = 0,
    statistic: Statistic = statistics.median,
    sync: Callable[[], None] | None = None,
) -> float:
    """`statistic` of the wall seconds of `repeats` calls of `work`, after `warmup` untimed calls.
    `sync` (e.g. torch.cuda.synchronize) runs before and after each timed call."""
    for _ in range(warmup):
        work()
    times = []
    for _ in range(repeats):
        if sync is not None:
            sync()
        started = time.perf_counter()
        work()
        if sync is not None:
            sync()
        times.append(time.perf_counter() - started)
    return statistic(times)


def render_table(header: Sequence[str], rows: Sequence[Sequence[Any]], right_from: int | None = None) -> str:
    """Plain-text columns two spaces apart; columns from index `right_from` on are right-aligned."""
    cells = [[str(c) for c in header], *([str(c) for c in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]

    def line(row: list[str]) -> str:
        right = right_from if right_from is not None else len(row)
        return "  ".join(c.rjust(w) if i >= right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip()

    return "\n".join(line(row) for row in cells)


def render_markdown(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table, ready to paste into docs/performance.md or docs/gpu-check.md."""
    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in rows]
    return "\n".join(lines)


def emit(table: str, report: dict[str, Any], json_out: Path | None) -> None:
    """Every benchmark's output: the table, the JSON on stdout, and the JSON in a file if asked."""
    print(table)
    print(json.dumps(report, indent=2))
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(report, indent=2) + "\n")


def cpu_isa() -> dict[str, Any]:
    """The CPU's model and its bf16 units: AMX (Intel Sapphire Rapids and later) multiplies bf16 tiles
    several times faster than AVX-512 BF16 (AMD Zen 4, Intel Cooper Lake) does."""
    flags: set[str] = set()
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    return {"model": model, "amx_bf16": "amx_bf16" in flags, "avx512_bf16": "avx512_bf16" in flags}


def run_group(command: list[str], env: dict[str, str], log_file: Path, timeout_s: float) -> None:
    """Run `command` in its own session, logging to `log_file`, and end its whole process group
    afterwards; a non-zero exit raises with the log's last lines, a timeout raises TimeoutExpired."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "w") as log:
        # Its own session: torchrun (or the launcher) and its ranks form one group we can end together.
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout_s)
        finally:  # Ctrl-C, timeout, a clean exit: never leave ranks behind
            end_group(proc)
    if code != 0:
        tail = "\n".join(log_file.read_text().splitlines()[-30:])
        raise RuntimeError(f"{command[:4]} exited with {code}; last lines of {log_file}:\n{tail}")


def end_group(proc: subprocess.Popen) -> None:
    """SIGTERM the run's process group (torchrun forwards it to the ranks), SIGKILL what is left.
    Also after a clean exit: a rank orphaned by a crashed torchrun would still be in the group."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
