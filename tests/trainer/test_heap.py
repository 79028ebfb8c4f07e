"""lifetime/heap.py: the cyclic collector paused for a body (the data check's bookkeeping), then as it was."""

from __future__ import annotations

import gc

import pytest

from maskrcnn_dist.lifetime.heap import gc_paused


def test_the_collector_is_paused_for_the_body_and_back_as_it_was() -> None:
    gc.enable()  # (as a process starts)
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner one restores the outer's state, not "on"
    assert gc.isenabled()
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError
    assert gc.isenabled()
