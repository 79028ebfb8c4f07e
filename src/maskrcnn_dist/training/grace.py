"""The termination grace period against what a stop costs: one step plus one checkpoint write.

On SIGTERM the trainer finishes the step in progress and writes its checkpoint (stop.py); Kubernetes
sends SIGKILL `terminationGracePeriodSeconds` after SIGTERM. When that is shorter than a step plus a
checkpoint write, every preemption loses the step in progress and the stop's checkpoint, silently. The
chart passes the pod's grace period as MASKRCNN_TERMINATION_GRACE_SECONDS; the main process measures
once, early (the second step it trains: the first one warms up allocators and kernels; and a trial
checkpoint write of the real state into the checkpoint folder, removed after), and warns once when it
does not fit. Unset: no measurement, no warning.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Mapping

from maskrcnn_launcher.contract import TERMINATION_GRACE_SECONDS

from ..errors import ConfigError

log = logging.getLogger(__name__)

#: The advice leaves room for slower steps (data, a busier node) and for leaving the process group.
ADVICE_FACTOR = 1.5
ADVICE_MARGIN_S = 10.0


def grace_seconds(env: Mapping[str, str] = os.environ) -> float | None:
    """The pod's grace period from the environment, or None when it is not set."""
    text = env.get(TERMINATION_GRACE_SECONDS, "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or math.isinf(value):
        raise ConfigError(f"{TERMINATION_GRACE_SECONDS}={text!r}: not a number of seconds (0 or more)")
    return value


def grace_problem(grace_s: float, step_s: float, save_s: float) -> str | None:
    """The warning when one step plus one checkpoint write does not fit in `grace_s`, else None."""
    needed = step_s + save_s
    if needed <= grace_s:
        return None
    advice = math.ceil(needed * ADVICE_FACTOR + ADVICE_MARGIN_S)
    return (
        f"a stop needs one step ({step_s:.1f}s) plus one checkpoint write ({save_s:.1f}s) = {needed:.1f}s, more than "
        f"the termination grace period {TERMINATION_GRACE_SECONDS}={grace_s:g}s: a preemption would be killed "
        f"before its checkpoint is written. Raise the pod's terminationGracePeriodSeconds (the chart value, which "
        f"sets {TERMINATION_GRACE_SECONDS} too) to at least {advice}"
    )


class GraceCheck:
    """Once per run, on the main process: the grace period against a measured step and checkpoint write."""

    def __init__(self, grace_s: float | None, clock: Callable[[], float] = time.perf_counter) -> None:
        self.grace_s = grace_s
        self.steps_seen = 0
        self._clock = clock

    def after_step(self, step_s: float, trial_save: Callable[[], None], last: bool) -> None:
        """Called after every step with its duration; measures on the second (or the last, if sooner)."""
        if self.grace_s is None:
            return
        self.steps_seen += 1
        if self.steps_seen < 2 and not last:
            return
        started = self._clock()
        trial_save()
        save_s = self._clock() - started
        if problem := grace_problem(self.grace_s, step_s, save_s):
            log.warning("%s", problem)
        else:
            log.info(
                "%s=%gs holds a stop: one step (%.1fs) plus one checkpoint write (%.1fs)",
                TERMINATION_GRACE_SECONDS,
                self.grace_s,
                step_s,
                save_s,
            )
        self.grace_s = None  # once
