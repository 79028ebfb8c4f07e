"""Who is in an elastic ddp group, agreed through the TCPStore the job already has (docs/elastic.md).

A member's id is its launch rank; a replacement pod's process takes its predecessor's id. A
generation is one process group over an ordered list of members (its rank order). The leader is the
master's process (id 0): a lost master restarts the whole job, so the leader is in every generation
and alone decides who is in the next one; the others only ever read that decision. Keys, all under
KEY_PREFIX:

  hb/<id>                the member's heartbeat: a counter its watcher bumps every `beat_s`
  gen                    the newest formed generation's number (the leader)
  g<g>/members           JSON list of generation g's member ids, in rank order (the leader)
  g<g>/abort             why generation g ended early: the first member that saw it end (compare_set)
  g<g>/alive/<id>        a member of g that saw it end and is still here
  g<g>/s<step>/n and /d  step's commit: every member counts in, the last sets d=ok; a failure d=abort
  joins and join/<n>     a replacement asking in: a counter and its id (the leader reads them)
  admitted/<id>          the generation that admitted a joiner
  gone/<id>              a member that left at a step boundary (a drain)
  finished               the leader's run ended: a joiner still waiting has nothing to join

Invariant: a key once written is never changed, except by compare_set from absent; so every reader
of a key sees the same value, and two members never disagree on a decision.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

KEY_PREFIX = "maskrcnn-elastic/"
LEADER = 0
COMMITTED = "ok"


@dataclass(frozen=True)
class ElasticPolicy:
    """Liveness and patience: a member whose heartbeat has not moved for `dead_after_s` is lost."""

    beat_s: float = 0.2
    dead_after_s: float = 2.0
    timeout_s: float = 1800.0  # a collective, and a wait for the leader's decision


@dataclass(frozen=True)
class Generation:
    number: int
    members: tuple[int, ...]  # ids in rank order; members[0] is the leader

    @property
    def size(self) -> int:
        return len(self.members)

    def rank_of(self, member: int) -> int:
        return self.members.index(member)


def connect(host: str, port: int, timeout_s: float) -> dist.Store:
    """A client of the job's TCPStore, its keys under KEY_PREFIX."""
    store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout_s))
    return dist.PrefixStore(KEY_PREFIX, store)


def store_wait(store: dist.Store, key: str, timeout_s: float, poll_s: float, give_up: Callable[[], bool]) -> bool:
    """Wait for `key`; False as soon as `give_up()` says so (checked every `poll_s`), TimeoutError after
    `timeout_s`. Polled with `check`: a store `wait` that times out logs a warning each time."""
    deadline = time.monotonic() + timeout_s
    while not store.check([key]):
        if give_up():
            return False
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {key!r} in the elastic store within {timeout_s:g}s")
        time.sleep(poll_s)
    return True


def read_generation(store: dist.Store, number: int) -> Generation:
    return Generation(number, tuple(json.loads(store.get(f"g{number}/members"))))


def publish_generation(store: dist.Store, generation: Generation, newcomers: Iterable[int]) -> None:
    """The leader's decision: the members first, then the joiners' admissions, then `gen`."""
    store.set(f"g{generation.number}/members", json.dumps(list(generation.members)))
    for member in newcomers:
        store.set(f"admitted/{member}", str(generation.number))
    store.set("gen", str(generation.number))


def current_generation(store: dist.Store) -> int | None:
    """The newest formed generation, None before the first one."""
    return int(store.get("gen")) if store.check(["gen"]) else None


def next_members(old: Generation, staying: Iterable[int], joiners: Iterable[int]) -> tuple[int, ...]:
    """The leader first, then the others in id (launch rank) order: a rank order every member derives alike."""
    others = sorted((set(staying) | set(joiners)) - {LEADER})
    return (LEADER, *others)


class Watcher:
    """A thread with its own store connection: bumps this member's heartbeat, sees a generation end
    (`ended`), and on the leader tracks when each watched member last beat (`silent_for`)."""

    def __init__(self, host: str, port: int, me: int, policy: ElasticPolicy) -> None:
        self.me, self.policy = me, policy
        self._store = connect(host, port, policy.timeout_s)
        self._lock = threading.Lock()
        self._generation: int | None = None
        self._ended: set[int] = set()
        self._beats: dict[int, tuple[int, float]] = {}  # id -> (last count, when it last changed)
        self._closed = threading.Event()
        self._store.add(f"hb/{me}", 1)
        self._thread = threading.Thread(target=self._run, name=f"elastic-watcher-{me}", daemon=True)
        self._thread.start()

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
        self._store.add(f"hb/{self.me}", 1)
        with self._lock:
            generation, watched = self._generation, list(self._beats)
        now = time.monotonic()
        for member in watched:
            count = self._store.add(f"hb/{member}", 0)
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
