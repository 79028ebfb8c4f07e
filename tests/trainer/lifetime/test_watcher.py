"""The elastic watcher's silence is what it saw: a stall of the observer (or of the store) is not a member's
silence, a member that stopped beating is still found silent after the dead time, and once the store is
lost the time since the last look is all silence. The looks are driven here on a clock of the test's own
(the watcher's thread is closed first), against a real TCPStore in this process."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import torch.distributed as dist

from maskrcnn_dist.lifetime import watcher as watcher_module
from maskrcnn_dist.lifetime.membership import ElasticPolicy, connect, heartbeat
from maskrcnn_dist.lifetime.watcher import LOOK_GAP_BEATS, Watcher

POLICY = ElasticPolicy(beat_s=0.1, dead_after_s=1.0, timeout_s=10.0, poll_s=0.01)
LEADER, PEER = 0, 1


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def store() -> Iterator[dist.TCPStore]:
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    yield server
    del server


@pytest.fixture
def looked(store: dist.TCPStore, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Watcher, Clock, dist.Store]]:
    """The leader's watcher of generation 0 with PEER in it, its thread closed; the test's clock; PEER's
    store client (to beat as PEER does). PEER has beaten once and been seen."""
    clock = Clock()
    monkeypatch.setattr(watcher_module, "time", clock)
    watcher = Watcher("127.0.0.1", store.port, LEADER, POLICY)
    watcher.close()
    watcher.watch(0, [LEADER, PEER])
    peer = connect("127.0.0.1", store.port, POLICY.timeout_s)
    peer.add(heartbeat(PEER), 1)
    watcher._beat()
    yield watcher, clock, peer


def test_a_stall_of_the_observer_is_not_the_members_silence(looked) -> None:
    watcher, clock, peer = looked
    clock.now += 5.0  # this process stalled 5 s: PEER beat meanwhile, not seen yet
    assert watcher.silent_for(PEER) == pytest.approx(LOOK_GAP_BEATS * POLICY.beat_s)
    watcher._beat()  # the first look after the stall: PEER had stalled too and not beaten yet
    assert watcher.silent_for(PEER) == pytest.approx(LOOK_GAP_BEATS * POLICY.beat_s)
    assert LOOK_GAP_BEATS * POLICY.beat_s < POLICY.dead_after_s
    peer.add(heartbeat(PEER), 1)
    clock.now += POLICY.beat_s
    watcher._beat()
    assert watcher.silent_for(PEER) == 0.0
    assert not peer.check(["g0/abort"])  # the leader's watcher ended nothing


def test_a_member_that_stopped_beating_is_silent_after_the_dead_time(looked) -> None:
    watcher, clock, peer = looked
    looks = round(POLICY.dead_after_s / POLICY.beat_s)  # a beat interval apart: the dead time's worth
    for _ in range(looks - 1):
        clock.now += POLICY.beat_s
        watcher._beat()
    assert watcher.silent_for(PEER) < POLICY.dead_after_s and not peer.check(["g0/abort"])
    for _ in range(2):
        clock.now += POLICY.beat_s
        watcher._beat()
    assert watcher.silent_for(PEER) == pytest.approx((looks + 1) * POLICY.beat_s)
    assert peer.get("g0/abort").decode() == f"member {PEER} silent for {POLICY.dead_after_s:g}s"


def test_once_the_store_is_lost_the_time_since_the_last_look_is_silence() -> None:
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    watcher = Watcher("127.0.0.1", server.port, PEER, POLICY)
    try:
        watcher.watch(0, [LEADER, PEER])
        time.sleep(3 * POLICY.beat_s)  # the thread looks at LEADER's heartbeat
        del server  # the store's host is gone (the master's process, in a job without an agent)
        watcher._thread.join(timeout=10)
        assert not watcher._thread.is_alive()
        time.sleep(2 * LOOK_GAP_BEATS * POLICY.beat_s)
        assert watcher.silent_for(LEADER) > 2 * LOOK_GAP_BEATS * POLICY.beat_s
    finally:
        watcher.close()
