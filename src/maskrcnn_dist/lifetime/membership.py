"""Who is in an elastic ddp group, agreed through the TCPStore the job already has (docs/elastic.md), and the
policy that decides it: pure functions of what the leader has seen, tested without a store.

A member's id is its launch rank; a replacement pod's process takes its predecessor's id. A generation is
one process group over an ordered list of members (its rank order). The leader is the master's process
(id 0): a lost master restarts the whole job, so the leader is in every generation and alone decides who
is in the next one (the policy below); the others only ever read that decision. Keys, all under KEY_PREFIX:

  hb/<id>                the member's heartbeat: a counter its watcher bumps every `beat_s`
  hb/<id>/t<n>           a joiner's heartbeat while ticket n waits (its id's may still be its predecessor's)
  gen                    the newest published generation's number (the leader)
  g<g>/members           JSON list of generation g's member ids, in rank order (the leader)
  g<g>/here/<id>         a member of g came to form it (before the process group's rendezvous)
  g<g>/abort             why generation g ended early (or never formed): the first member that saw it
  g<g>/alive/<id>        a member of g that saw it end and is still here
  g<g>/gone/<id>         a member of g that left at its step boundary (a drain)
  g<g>/s<step>/n and /d  step's commit: every member counts in, the last sets d=ok; a failure d=abort
  g<g>/stop              the leader's word to a generation held below the minimum size: stop
  joins and join/<n>     a replacement asking in: a counter, and ticket n's id (the leader reads them)
  admitted/<n>           the answer to ticket n: the generation that admits it, or "refused: <why>"
  finished               the leader's run ended: a joiner still waiting has nothing to join

Invariant: a key once written is never changed, except by compare_set from absent; so every reader of a
key sees the same value, and two members never disagree on a decision. An admission is an answer to one
ticket, so it is single-use: a launch rank replaced again asks with a new ticket.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from enum import Enum

import torch.distributed as dist

KEY_PREFIX = "maskrcnn-elastic/"
LEADER = 0
COMMITTED = "ok"
REFUSED = "refused: "


@dataclass(frozen=True)
class ElasticPolicy:
    """Liveness and patience, and the group's rules, stated where the group is made (torchft's Manager
    takes its `min_replica_size` so): a member whose heartbeat has not moved for `dead_after_s` is lost;
    the group trains on with `min_size` members or more; with fewer, its members hold at the step
    boundary for up to `min_wait_s` for replacements, then stop."""

    beat_s: float = 0.2
    dead_after_s: float = 2.0
    timeout_s: float = 1800.0  # a collective, and a wait for the leader's decision
    poll_s: float = 0.05  # how often a wait on the store looks again (a step's commit waits once)
    min_size: int = 1  # --elastic-min-size
    min_wait_s: float = 300.0  # --elastic-min-wait


@dataclass(frozen=True)
class Generation:
    number: int
    members: tuple[int, ...]  # ids in rank order; members[0] is the leader

    @property
    def size(self) -> int:
        return len(self.members)

    def rank_of(self, member: int) -> int:
        return self.members.index(member)


# -- the policy: pure functions of what the leader has seen ------------------------------------------


def stays(answered: bool, gone: bool, silent_s: float, policy: ElasticPolicy) -> bool | None:
    """Whether a member of an ended generation is in the next one: True once it said it is still here,
    False once it left at a boundary (a drain) or its heartbeat stopped; None while neither (wait)."""
    if answered:
        return True
    if gone or silent_s > policy.dead_after_s:
        return False
    return None


@dataclass(frozen=True)
class Admissions:
    """The leader's answer to the join tickets it holds (ticket -> id): those it admits now, those it
    refuses (with why), and those that wait (their id is still a member: its old process not yet lost)."""

    admit: dict[int, int]
    refuse: dict[int, str]
    wait: dict[int, int]


def admissions(tickets: Mapping[int, int], beating: Collection[int], members: Collection[int]) -> Admissions:
    """Who joins: of each id's tickets the newest, if the id is no longer a member and the ticket's holder
    beats (`beating`: tickets); an older ticket of the same id is refused (that process was replaced before
    it was admitted), and so is one whose holder fell silent (it died while it waited)."""
    newest = {member: ticket for ticket, member in sorted(tickets.items())}
    admit, refuse, wait = {}, {}, {}
    for ticket, member in sorted(tickets.items()):
        if newest[member] != ticket:
            refuse[ticket] = f"member {member} asked again (ticket {newest[member]})"
        elif member in members:
            wait[ticket] = member
        elif ticket in beating:
            admit[ticket] = member
        else:
            refuse[ticket] = f"member {member} fell silent while it waited"
    return Admissions(admit, refuse, wait)


def admits_at(after_step: int, total_steps: int) -> bool:
    """Whether the leader admits newcomers at the boundary after `after_step`: at any but the last (a
    newcomer would have nothing left to train). The place for a rule such as "only at epoch ends"."""
    return after_step < total_steps


def enough(size: int, policy: ElasticPolicy) -> bool:
    """Whether a generation of `size` members trains on (torchft's `num_participants >= min_replica_size`)."""
    return size >= policy.min_size


class Hold(Enum):
    GO_ON = "go on"  # enough members again: form the next generation with the replacements
    WAIT = "wait"  # still too few: wait for replacements
    STOP = "stop"  # too few after the whole wait: stop, the state saved


def after_waiting(size: int, waited_s: float, policy: ElasticPolicy) -> Hold:
    """A generation held below the minimum: what `size` members (replacements included) do after `waited_s`."""
    if enough(size, policy):
        return Hold.GO_ON
    return Hold.STOP if waited_s >= policy.min_wait_s else Hold.WAIT


def heartbeat(member: int, ticket: int | None = None) -> str:
    """The key a member beats on; `ticket`: a joiner's while that ticket waits."""
    return f"hb/{member}" if ticket is None else f"hb/{member}/t{ticket}"


def next_members(staying: Iterable[int], joiners: Iterable[int]) -> tuple[int, ...]:
    """The leader first, then the others in id (launch rank) order: a rank order every member derives alike."""
    others = sorted((set(staying) | set(joiners)) - {LEADER})
    return (LEADER, *others)


# -- the store ---------------------------------------------------------------------------------------


def connect(host: str, port: int, timeout_s: float) -> dist.Store:
    """A client of the job's TCPStore, its keys under KEY_PREFIX."""
    store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout_s))
    return dist.PrefixStore(KEY_PREFIX, store)


def store_wait(
    store: dist.Store, keys: str | Iterable[str], timeout_s: float, poll_s: float, give_up: Callable[[], bool]
) -> str | None:
    """Wait for `keys` (one, or the first of several); the one that came, or None as soon as `give_up()`
    says so (checked every `poll_s`), TimeoutError after `timeout_s`. Polled with `check`: a store `wait`
    that times out logs a warning each time."""
    keys = [keys] if isinstance(keys, str) else list(keys)
    deadline = time.monotonic() + timeout_s
    while not (came := next((key for key in keys if store.check([key])), None)):
        if give_up():
            return None
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {' or '.join(map(repr, keys))} in the elastic store within {timeout_s:g}s")
        time.sleep(poll_s)
    return came


def read_generation(store: dist.Store, number: int) -> Generation:
    return Generation(number, tuple(json.loads(store.get(f"g{number}/members"))))


def publish_generation(store: dist.Store, generation: Generation, admitted: Iterable[int]) -> None:
    """The leader's decision: the members first, then the answers to the admitted tickets, then `gen`."""
    store.set(f"g{generation.number}/members", json.dumps(list(generation.members)))
    for ticket in admitted:
        store.set(f"admitted/{ticket}", str(generation.number))
    store.set("gen", str(generation.number))


def current_generation(store: dist.Store) -> int | None:
    """The newest published generation, None before the first one."""
    return int(store.get("gen")) if store.check(["gen"]) else None
