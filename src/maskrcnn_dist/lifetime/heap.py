"""The cyclic garbage collector paused around work that makes many objects and no cycles."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """The collector off for the body, then as it was. Every allocation past a threshold makes it scan
    the young objects, and in time the whole heap (torch's modules: a million objects); a body that
    builds 118k paths and records (the data check's bookkeeping at COCO's size) spends half its time
    there for no cycle found. What the body drops is freed by reference counting all the same."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
