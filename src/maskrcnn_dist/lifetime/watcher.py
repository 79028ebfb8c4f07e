"""A member's watcher thread (membership.py's keys): it bumps this member's heartbeat, sees the watched
generation end, and tracks how long each watched member's heartbeat has stood still; the leader's also
ends a generation whose member fell silent. It has its own store connection, so that it beats while the
main thread waits in a collective or a store call.

Silence is what this thread saw, not the clock: the time between two of its looks counts up to
LOOK_GAP_BEATS beat intervals. A stall of the observer (its process descheduled, the store slow to
answer, a loaded machine) would otherwise count as the silence of every member it watches, and two
members that both stalled would each drop the other: seen as "member 1 did not come to form generation
1" on the leader and "the master fell silent" on member 1 at once, on a 2-core machine under load."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import torch.distributed as dist

from .membership import LEADER, ElasticPolicy, connect, heartbeat

# The most of one gap between two looks that counts as a member's silence, in beat intervals.
LOOK_GAP_BEATS = 2.0


class Watcher:
    """A thread with its own store connection: bumps this process's heartbeat (`beat_as`: a member's
    `hb/<id>`, a joiner's its ticket's until it is admitted, so that a replacement never beats for the
    process it replaces), sees a generation end (`ended`), and tracks how long each watched member's
    heartbeat has stood still while it looked (`silent_for`)."""

    def __init__(self, host: str, port: int, me: int, policy: ElasticPolicy) -> None:
        self.me, self.policy = me, policy
        self._store = connect(host, port, policy.timeout_s)
        self._lock = threading.Lock()
        self._generation: int | None = None
        self._ended: set[int] = set()
        # id -> (the count last seen, the silence seen up to the last look, when that look was)
        self._beats: dict[int, tuple[int, float, float]] = {}
        self._max_gap_s = LOOK_GAP_BEATS * policy.beat_s
        self._key: str | None = None  # the heartbeat this process bumps
        self._closed = threading.Event()
        self._store_lost = threading.Event()  # this thread's store calls failed: it looks no more
        self._thread = threading.Thread(target=self._run, name=f"elastic-watcher-{me}", daemon=True)
        self._thread.start()

    def beat_as(self, key: str) -> None:
        """Bump `key` from now on (at the next beat)."""
        with self._lock:
            self._key = key

    def watch(self, generation: int | None, members: Sequence[int]) -> None:
        """From now on: notice generation `generation` ending; track these members' heartbeats."""
        now = time.monotonic()
        with self._lock:
            self._generation = generation
            self._beats = {m: self._beats.get(m, (-1, 0.0, now)) for m in members if m != self.me}

    def ended(self, generation: int) -> bool:
        with self._lock:
            return generation in self._ended

    def silent_for(self, member: int) -> float:
        """Seconds this watcher has seen `member`'s heartbeat stand still (0 for one not tracked): since it
        last moved, each gap between two looks (and the one since the last) counted up to the most a gap
        may count."""
        with self._lock:
            seen = self._beats.get(member)
        if seen is None:
            return 0.0
        since_look = time.monotonic() - seen[2]
        # Once the store is lost this thread no longer looks: nobody's heartbeat can be seen, and the time
        # since the last look is all silence (a follower whose master hosted the store learns it so).
        return seen[1] + (since_look if self._store_lost.is_set() else self._gap(since_look))

    def _gap(self, seconds: float) -> float:
        return min(seconds, self._max_gap_s)

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._closed.wait(self.policy.beat_s):
            try:
                self._beat()
            except (dist.DistError, RuntimeError):  # the store is gone: the job is ending
                self._store_lost.set()
                return

    def _beat(self) -> None:
        with self._lock:
            key, generation, watched = self._key, self._generation, list(self._beats)
        if key is not None:
            self._store.add(key, 1)
        for member in watched:
            count = self._store.add(heartbeat(member), 0)
            now = time.monotonic()
            with self._lock:
                last = self._beats.get(member)
                if last is not None:
                    silent = 0.0 if last[0] != count else last[1] + self._gap(now - last[2])
                    self._beats[member] = (count, silent, now)
        if generation is not None and self._store.check([f"g{generation}/abort"]):
            with self._lock:
                self._ended.add(generation)
        elif generation is not None and self.me == LEADER:
            silent = [m for m in watched if self.silent_for(m) > self.policy.dead_after_s]
            if silent:
                reason = f"member {silent[0]} silent for {self.policy.dead_after_s:g}s"
                self._store.compare_set(f"g{generation}/abort", "", reason)
