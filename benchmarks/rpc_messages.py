"""Count the RPC messages of a time window, from TensorPipe's own log (for bench_pipeline.py).

With ``TP_VERBOSE_LOGGING=1`` TensorPipe logs every message a process writes on a pipe, with the time:

    V1127 07:08:30.331456  5576 tensorpipe/core/pipe_impl.cc:550] Pipe w1_to_w0 received a write request (#1, ...

A pipe named ``A_to_B`` is A's connection to B (A's requests), one named ``B[l0]_from_A`` is B's end
of A's connection (B's responses). Every RPC message is written exactly once, by its sender, so the
lines of all processes between two instants are the messages of that window: calls, responses,
RRef forks and their acknowledgements, RRef deletions, dist_autograd's backward and clean-up, all
of them, whoever sends them. The processes must share one clock (one host).
"""

from __future__ import annotations

import os
import re
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

VERBOSE = {"TP_VERBOSE_LOGGING": "1"}
WRITE = re.compile(
    r"V(\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{6}) +\d+ \S*pipe_impl\.cc:\d+\] Pipe (\S+) received a write request"
)


def _instant(t: float) -> tuple[int, ...]:
    d = datetime.fromtimestamp(t)  # the log's clock is local time
    return (d.month, d.day, d.hour, d.minute, d.second, d.microsecond)


def writes(logs: Iterable[Path], start: float, end: float) -> Counter[str]:
    """Messages written between `start` and `end` (time.time()), by pipe name, over every log."""
    lo, hi = _instant(start), _instant(end)
    found: Counter[str] = Counter()
    for log in logs:
        for m in WRITE.finditer(log.read_text(errors="replace")):
            if lo <= tuple(int(g) for g in m.groups()[:6]) <= hi:
                found[m.group(7)] += 1
    return found


def by_kind(found: Counter[str]) -> dict[str, int]:
    """Requests (on `A_to_B` pipes) and responses (on `B[lN]_from_A` pipes)."""
    requests = sum(n for pipe, n in found.items() if "_from_" not in pipe)
    return {"messages": sum(found.values()), "requests": requests, "responses": sum(found.values()) - requests}


@contextmanager
def stderr_to(path: Path) -> Iterator[None]:
    """This process's file descriptor 2 (C++ logs included) appended to `path` for the body."""
    sys.stderr.flush()
    saved = os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 2)
    os.close(fd)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
