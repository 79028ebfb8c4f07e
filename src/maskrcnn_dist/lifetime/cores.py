"""How many cores this process may run on (its CPU affinity: a pod's cpuset, taskset), torch-free: the
command line decides with it before torch is imported (data/parse_ahead.py)."""

from __future__ import annotations

import os


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
