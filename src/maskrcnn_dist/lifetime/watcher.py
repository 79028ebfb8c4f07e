"""A member's watcher thread (membership.py's keys): it bumps this member's heartbeat, sees the watched
generation end, and tracks when each watched member last beat; the leader's also ends a generation whose
member fell silent. It has its own store connection, so that it beats while the main thread waits in a
collective or a store call."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import torch.distributed as dist

from .membership import LEADER, ElasticPolicy, connect, heartbeat


class Watcher:
    """A thread with its own store connection: bumps this process's heartbeat (`beat_as`: a member's
    `hb/<id>`, a joiner's its ticket's until it is admitted, so that a replacement never beats for the
    process it replaces), sees a generation end (`ended`), and tracks when each watched member last beat
    (`silent_for`)."""

    def __init__(self, host: str, port: int, me: int, policy: ElasticPolicy) -> None:
        self.me, self.policy = me, policy
        self._store = connect(host, port, policy.timeout_s)
        self._lock = threading.Lock()
        self._generation: int | None = None
        self._ended: set[int] = set()
        self._beats: dict[int, tuple[int, float]] = {}  # id -> (last count, when it last changed)
        self._key: str | None = None  # the heartbeat this process bumps
        self._closed = threading.Event()
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
            self._beats = {m: self._beats.get(m, (-1, now)) for m in members if m != self.me}

    def ended(self, generation: int) -> bool:
        with self._lock:
            return generation in self._ended

    def silent_for(self, member: int) -> float:
        """Seconds since `member`'s heartbeat last moved (0 for one not tracked)."""
        with self._lock:
            count_and_time = self._beats.get(member)
        return 0.0 if count_and_time is None else time.monotonic() - count_and_time[1]

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._closed.wait(self.policy.beat_s):
            try:
                self._beat()
            except (dist.DistError, RuntimeError):  # the store is gone: the job is ending
                return

    def _beat(self) -> None:
        with self._lock:
            key, generation, watched = self._key, self._generation, list(self._beats)
        if key is not None:
            self._store.add(key, 1)
        now = time.monotonic()
        for member in watched:
            count = self._store.add(heartbeat(member), 0)
            with self._lock:
                last = self._beats.get(member)
                if last is not None and last[0] != count:
                    self._beats[member] = (count, now)
        if generation is not None and self._store.check([f"g{generation}/abort"]):
            with self._lock:
                self._ended.add(generation)
        elif generation is not None and self.me == LEADER:
            silent = [m for m in watched if self.silent_for(m) > self.policy.dead_after_s]
            if silent:
                reason = f"member {silent[0]} silent for {self.policy.dead_after_s:g}s"
                self._store.compare_set(f"g{generation}/abort", "", reason)
