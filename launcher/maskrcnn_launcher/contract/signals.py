"""The signals that stop a trainer, and the one way every process takes signals for a while.

A pod is stopped by signals (Kubernetes' SIGTERM, a terminal's SIGINT), and the launcher's processes
(`maskrcnn-launch local`, `launch` while a worker waits) and the trainer's (the CLI, the torchrun
wrapper, stop.py's StopRequest) must agree on which: they are named here once. `signal_handlers` is
the one way to install handlers for a block and give the previous ones back after it.

Standard library only: the trainer installs its handlers before torch loads.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from types import FrameType
from typing import Any

__all__ = ["FORWARDED_STOP", "STOP_SIGNALS", "signal_handlers"]

#: What asks a trainer process to stop: pod deletion and `docker stop` (SIGTERM), Ctrl-C (SIGINT).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: A stop request forwarded by a supervisor that got one of STOP_SIGNALS (the torchrun wrapper to its
#: ranks): never a second signal.
FORWARDED_STOP = signal.SIGUSR1

#: What `signal.signal` takes: a function of (signum, frame), or SIG_DFL / SIG_IGN.
Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers


def _never() -> bool:
    return False


@contextmanager
def signal_handlers(handlers: Mapping[int, Handler], keep: Callable[[], bool] = _never) -> Iterator[None]:
    """`handlers` (signal -> handler) installed for the body (main thread only, as Python requires); on
    leaving it, normally or by an exception, the previous handlers are back, unless `keep()` says this
    process is on its way out and must keep them (a stop was requested: a late duplicate signal must not
    kill it)."""
    previous: dict[int, Any] = {}
    try:
        for signum, handler in handlers.items():
            previous[signum] = signal.signal(signum, handler)
        yield
    finally:
        if not keep():
            for signum, handler in previous.items():
                signal.signal(signum, handler)
