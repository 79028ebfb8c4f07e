"""A pytest plugin that gives each pytest-xdist worker its share of the CPUs.

`make test` runs two workers on 2 cores. Each worker's own torch, and every process a test starts,
would take as many intra-op threads as the machine has cores: four busy threads on two cores, and
OpenMP's threads spin while they wait for each other (one training step measured 3.9-4.4 s with one
thread against 20-25 s with two, three pairs, on a loaded 2-core machine). In a worker this sets
OMP_NUM_THREADS (read by every process it starts that does not set its own; torch reads it at import)
and `TEST_THREADS_ENV` (what `tests/trainer/conftest.py:threads_for_tests` gives the trainer tests) to
cpus // workers, at least 1. Outside xdist nothing changes: a test's threads are its own (2).
A user's OMP_NUM_THREADS is kept.

Loaded by tests/conftest.py (`pytest_plugins`).
"""

from __future__ import annotations

import os
import sys

import pytest

TEST_THREADS_ENV = "MASKRCNN_TEST_THREADS"


def threads_per_worker(cpus: int, workers: int) -> int:
    return max(1, cpus // max(1, workers))


def pytest_configure(config: pytest.Config) -> None:
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        return
    threads = threads_per_worker(os.cpu_count() or 1, int(workerinput.get("workercount", 1)))
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    os.environ.setdefault(TEST_THREADS_ENV, os.environ["OMP_NUM_THREADS"])
    if "torch" in sys.modules:  # imported before this ran: it has read the variable already
        sys.modules["torch"].set_num_threads(int(os.environ[TEST_THREADS_ENV]))
