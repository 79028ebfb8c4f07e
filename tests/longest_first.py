"""A pytest plugin that hands pytest-xdist's workers the longest test files first.

`make test` runs `-n 2 --dist loadfile --no-loadscope-reorder`: each worker takes a whole file (its
module fixtures, a trained run or a started group, stay shared by the tests that read them) and the
next one when it is nearly done. Taken in the order of the committed baseline's seconds per file
(tests/hack/timings-baseline.json), longest first, the workers end within about one short file of
each other, where collection order could leave the slowest file to start last. A file the baseline
does not know yet goes first (it may be long; it is not known to be short), and so does a file with a
test the baseline does not know: a new one, or one `make test` leaves to CI (the GPU check's 8-minute
rehearsal sits in a file whose other tests take a second; by that file's seconds it started last).

Only xdist's workers reorder (they must agree, and they read the same baseline); a plain pytest keeps
the collection order. Within a file the order is the file's own.

Loaded by tests/conftest.py (`pytest_plugins`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import pytest
from hack.timings import BASELINE, read_baseline


def seconds_per_file(baseline: dict[str, float], nodeids: Iterable[str] = ()) -> dict[str, float]:
    """Each file's baseline seconds; a file holding one of `nodeids` that the baseline lacks is left out
    (unknown: `longest_first` takes it first)."""
    files: dict[str, float] = defaultdict(float)
    for nodeid, wall in baseline.items():
        files[nodeid.split("::", 1)[0]] += wall
    for nodeid in nodeids:
        if nodeid not in baseline:
            files.pop(nodeid.split("::", 1)[0], None)
    return dict(files)


def longest_first(nodeids: list[str], files: dict[str, float]) -> list[int]:
    """Positions of `nodeids` reordered: files by their seconds, longest (or unknown) first; stable."""
    first_seen = {}
    for position, nodeid in enumerate(nodeids):
        first_seen.setdefault(nodeid.split("::", 1)[0], position)

    def key(position: int) -> tuple[float, int, int]:
        path = nodeids[position].split("::", 1)[0]
        return (-files.get(path, float("inf")), first_seen[path], position)

    return sorted(range(len(nodeids)), key=key)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput") or not BASELINE.exists():
        return
    nodeids = [item.nodeid for item in items]
    order = longest_first(nodeids, seconds_per_file(read_baseline(BASELINE), nodeids))
    items[:] = [items[position] for position in order]
