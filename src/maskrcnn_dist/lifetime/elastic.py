"""An elastic ddp group: survivors of a lost member go on in a new process group, a replacement joins at a
step boundary, a drained member leaves at one (docs/elastic.md). Membership is agreed through the
job's TCPStore (membership.py); each generation is torch's default process group, so the engines'
collectives (DDP, all_reduce, gather_object) use it unchanged.

The step's protocol, on every member:
  1. the step's collectives (DDP's gradient all-reduce, the loss all-reduce with `boundary_flags`);
  2. `commit(step)`: nothing may change the weights before it returns; it returns on every member of
     the generation or on none (the store's compare_set decides), so the replicas never diverge;
  3. the optimizer step; then at the boundary `read_boundary` says who leaves and whether the leader
     admits joiners, and `regroup` forms the next generation.
A failure in 1 or 2 (a collective that errors, an aborted commit) goes to `recover()`: the generation
is marked ended (which releases every member's commit), the old group dropped (which releases peers
blocked on this process's sockets), and the leader forms the next generation of those still here.
The step in flight was committed nowhere: the caller redoes it in the new generation. The caller drops
whatever holds the old group (a DistributedDataParallel wrapper) before `recover()` and `regroup()`,
so that dropping it closes the sockets, and wraps the model again in the new generation; after every
new generation it calls `share_state` (a newcomer receives the leader's state there).
"""

from __future__ import annotations

import gc
import logging
import pickle
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from maskrcnn_launcher.contract import format_membership_line

from .membership import (
    COMMITTED,
    LEADER,
    ElasticPolicy,
    Generation,
    Watcher,
    connect,
    current_generation,
    next_members,
    publish_generation,
    read_generation,
    store_wait,
)

log = logging.getLogger(__name__)
POLL_S = 0.05


class StepAborted(RuntimeError):
    """The step in flight was not committed: a member was lost. Recover, then redo it."""


class LeaderLost(RuntimeError):
    """The master's process fell silent: the group cannot go on (the job restarts from its checkpoint)."""


@dataclass(frozen=True)
class BoundaryDecision:
    """What every member read from the step's flags: stop everyone (the leader was asked), who leaves
    (a member asked to stop: a drain), and whether the leader admits waiting joiners."""

    stop_all: bool
    leaving: tuple[int, ...]
    admit: bool

    @property
    def regroup(self) -> bool:
        return bool(self.leaving) or self.admit


class ElasticGroup:
    """This process's membership of the elastic group; `start()` forms or joins the first generation."""

    def __init__(
        self, host: str, port: int, me: int, launch_world: int, backend: str, policy: ElasticPolicy | None = None
    ) -> None:
        self.me, self.launch_world, self.backend = me, launch_world, backend
        self.policy = policy = policy or ElasticPolicy()
        self.store = connect(host, port, policy.timeout_s)
        self.watcher = Watcher(host, port, me, policy)
        self.generation: Generation | None = None
        self.newcomers: tuple[int, ...] = ()  # members the last generation admitted (they need the state)
        self.lost: tuple[int, ...] = ()  # members the last recovery left behind
        self.steps_done = 0  # steps committed in this process's generations
        self._joins_seen = 0

    # -- the generation -------------------------------------------------------------------------

    @property
    def rank(self) -> int:
        return self._generation().rank_of(self.me)

    @property
    def size(self) -> int:
        return self._generation().size

    @property
    def is_leader(self) -> bool:
        return self.me == LEADER

    def start(self) -> Generation | None:
        """Generation 0 of every launch rank, or, when the job is already past it (this process replaces
        a lost one), wait to be admitted at the leader's next step boundary; None when the leader's run
        ended meanwhile (nothing left to join)."""
        if current_generation(self.store) is None:
            return self._form(Generation(0, tuple(range(self.launch_world))), newcomers=())
        return self._join()

    def _join(self) -> Generation | None:
        number = self.store.add("joins", 1)
        self.store.set(f"join/{number}", str(self.me))
        log.info("elastic: member %d asks to join; waiting for a step boundary", self.me)
        self.watcher.watch(None, [LEADER])
        if not self._wait_for_leader(f"admitted/{self.me}"):
            return None
        generation = read_generation(self.store, int(self.store.get(f"admitted/{self.me}")))
        return self._form(generation, newcomers=(self.me,))

    def _form(self, generation: Generation, newcomers: Iterable[int]) -> Generation:
        prefix = dist.PrefixStore(f"g{generation.number}/pg", self.store)
        dist.init_process_group(
            self.backend,
            store=prefix,
            rank=generation.rank_of(self.me),
            world_size=generation.size,
            timeout=timedelta(seconds=self.policy.timeout_s),
        )
        if self.is_leader and generation.number == 0:  # later ones the leader published before forming
            publish_generation(self.store, generation, ())
        self.generation, self.newcomers = generation, tuple(newcomers)
        self.watcher.watch(generation.number, generation.members)
        return generation

    def _generation(self) -> Generation:
        if self.generation is None:
            raise RuntimeError("the elastic group has not started")
        return self.generation

    # -- the step -------------------------------------------------------------------------------

    def boundary_flags(self, leave: bool, stop: bool) -> torch.Tensor:
        """This member's part of the step's flags, to be summed over the generation with the loss terms:
        [the leader asked to stop, the leader admits joiners, one slot per rank: that rank leaves]."""
        flags = torch.zeros(2 + self.size)
        if self.is_leader:
            flags[0] = float(stop)
            flags[1] = float(self._joiners_waiting())
        elif leave:
            flags[2 + self.rank] = 1.0
        return flags

    def read_boundary(self, summed: torch.Tensor) -> BoundaryDecision:
        members = self._generation().members
        leaving = tuple(m for i, m in enumerate(members) if summed[2 + i] > 0)
        return BoundaryDecision(stop_all=bool(summed[0] > 0), leaving=leaving, admit=bool(summed[1] > 0))

    def commit(self, step: int) -> None:
        """Return on every member of the generation once all have reached it, on none if one is lost
        (StepAborted): the commit point before the optimizer step."""
        number = self._generation().number
        key = f"g{number}/s{step}"
        if self.store.add(f"{key}/n", 1) == self.size:
            self.store.compare_set(f"{key}/d", "", COMMITTED)
        ended = lambda: self.watcher.ended(number) or self._leader_silent()  # noqa: E731
        if not store_wait(self.store, f"{key}/d", self.policy.timeout_s, POLL_S, give_up=ended):
            self.store.compare_set(f"{key}/d", "", "abort")
        if self.store.get(f"{key}/d").decode() != COMMITTED:
            raise StepAborted(f"step {step + 1} was not committed in generation {number}: {self._abort_reason()}")
        self.steps_done = step + 1

    # -- changes of membership ------------------------------------------------------------------

    def recover(self, cause: str) -> Generation | None:
        """After a failed collective or an aborted commit (`cause`: what failed, in words): the next
        generation of those still here (and the joiners waiting). A member the leader left out (counted
        lost while it was only slow) joins again; None if the leader's run ended meanwhile.

        Call it after the `except` block, not inside: a live exception keeps the failed collective's
        frames, and through them the old group and its sockets, which peers blocked on them wait for."""
        old = self._generation()
        self.store.compare_set(f"g{old.number}/abort", "", f"member {self.me}: {cause[:200]}")
        self._drop_group()  # closes this process's sockets: peers blocked on them are released
        self.store.set(f"g{old.number}/alive/{self.me}", "1")
        if self.is_leader:
            staying = self._survivors(old)
            self.lost = tuple(m for m in old.members if m not in staying)
            joiners = self._take_joiners()
            generation = Generation(old.number + 1, next_members(old, staying, joiners))
            publish_generation(self.store, generation, [j for j in joiners if j in generation.members])
            log.warning("elastic: generation %d ended: %s", old.number, self._abort_reason(old.number))
            self._announce(old, generation)
            return self._form(generation, newcomers=joiners)
        return self._follow(old.number + 1)

    def regroup(self, decision: BoundaryDecision) -> Generation | None:
        """At a step boundary, on every member: the next generation without the members leaving and with
        the joiners the leader admits. None on a member that leaves (it is out of the group now)."""
        old = self._generation()
        if self.me in decision.leaving:
            self.store.set(f"gone/{self.me}", str(old.number))
            self._drop_group()
            self.generation = None
            return None
        self._drop_group()
        if not self.is_leader:
            return self._follow(old.number + 1)
        joiners = self._take_joiners() if decision.admit else []
        staying = [m for m in old.members if m not in decision.leaving]
        generation = Generation(old.number + 1, next_members(old, staying, joiners))
        publish_generation(self.store, generation, joiners)
        self.lost = ()
        self._announce(old, generation, leaving=decision.leaving)
        return self._form(generation, newcomers=joiners)

    def share_state(self, state: Any) -> Any:
        """After a generation that admitted newcomers: the leader sends `state` (its checkpoint's dict) to
        each; a newcomer returns what it received, every other member its own `state`."""
        generation = self._generation()
        if not self.newcomers and not self.is_leader:
            return state
        if self.is_leader:
            payload = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL) if self.newcomers else b""
            for member in self.newcomers:
                _send_bytes(payload, generation.rank_of(member))
            return state
        return pickle.loads(_recv_bytes(generation.rank_of(LEADER)))

    def close(self, finished: bool = False) -> None:
        """Leave for good; `finished` (the leader's run ended): a joiner still waiting exits."""
        if finished and self.is_leader:
            self.store.set("finished", "1")
        self.watcher.close()
        self._drop_group()

    # -- the leader's side ----------------------------------------------------------------------

    def _joiners_waiting(self) -> bool:
        return self.store.add("joins", 0) > self._joins_seen

    def _take_joiners(self) -> list[int]:
        """The ids of the replacements that asked since the last look and still beat: one that died while
        it waited would hold the next group's formation until the group timeout."""
        count = self.store.add("joins", 0)
        ids = [int(self.store.get(f"join/{n}")) for n in range(self._joins_seen + 1, count + 1)]
        self._joins_seen = count
        alive = sorted(m for m in set(ids) if self._beating(m))
        if dead := sorted(set(ids) - set(alive)):
            log.warning("elastic: members %s asked to join but fell silent: not admitted", dead)
        return alive

    def _beating(self, member: int) -> bool:
        """Whether `member`'s heartbeat moves within the dead time (a live one moves within a beat)."""
        first = self.store.add(f"hb/{member}", 0)
        deadline = time.monotonic() + self.policy.dead_after_s
        while time.monotonic() < deadline:
            time.sleep(self.policy.beat_s / 2)
            if self.store.add(f"hb/{member}", 0) != first:
                return True
        return False

    def _survivors(self, old: Generation) -> list[int]:
        """The members of `old` still here: each counted alive, or out once gone (drained) or silent."""
        self.watcher.watch(None, old.members)  # keep their heartbeats tracked, stop watching `old`
        pending = {m for m in old.members if m != self.me}
        staying = [self.me]
        deadline = time.monotonic() + self.policy.timeout_s
        while pending:
            for member in sorted(pending):
                if self.store.check([f"g{old.number}/alive/{member}"]):
                    staying.append(member)
                    pending.discard(member)
                elif self.store.check([f"gone/{member}"]) or self.watcher.silent_for(member) > self.policy.dead_after_s:
                    pending.discard(member)
            if pending and time.monotonic() > deadline:
                raise TimeoutError(f"members {sorted(pending)} neither answered nor fell silent")
            if pending:
                time.sleep(POLL_S)
        return staying

    def _announce(self, old: Generation, new: Generation, leaving: Iterable[int] = ()) -> None:
        """One line per change (the contract's, which `maskrcnn-launch status` counts in the master's log)."""
        left = set(leaving)
        for member in old.members:
            if member not in new.members:
                event = "left" if member in left else "lost"
                log.warning("%s", format_membership_line(event, member, self.steps_done, new.size))
        for member in new.members:
            if member not in old.members:
                log.warning("%s", format_membership_line("joined", member, self.steps_done, new.size))

    # -- a follower's side ----------------------------------------------------------------------

    def _follow(self, number: int) -> Generation | None:
        if not self._wait_for_leader(f"g{number}/members"):
            return None
        generation = read_generation(self.store, number)
        if self.me not in generation.members:
            log.warning("elastic: generation %d formed without member %d; joining again", number, self.me)
            return self._join()
        self.lost = ()
        return self._form(generation, newcomers=())

    def wait_for_leader(self, key: str) -> bool:
        """Wait for the leader to write `key` (see `_wait_for_leader`)."""
        return self._wait_for_leader(key)

    def _wait_for_leader(self, key: str) -> bool:
        """Wait for the leader to write `key`: False when its run has ended meanwhile, LeaderLost once its
        heartbeat has stopped without that."""
        over = lambda: self.store.check(["finished"]) or self._leader_silent()  # noqa: E731
        if store_wait(self.store, key, self.policy.timeout_s, POLL_S, give_up=over):
            return True
        if self.store.check(["finished"]):
            return False
        raise LeaderLost(f"the master (member {LEADER}) fell silent: the group cannot go on without it")

    def _leader_silent(self) -> bool:
        return self.watcher.silent_for(LEADER) > self.policy.dead_after_s

    def _abort_reason(self, number: int | None = None) -> str:
        key = f"g{self._generation().number if number is None else number}/abort"
        return self.store.get(key).decode() if self.store.check([key]) else "no reason recorded"

    def _drop_group(self) -> None:
        """Tear the current group down; the collector then frees what still held it (its sockets close)."""
        if dist.is_initialized():
            if self.backend == "nccl":  # a communicator with a lost peer must be aborted, not torn down
                dist.distributed_c10d._abort_process_group()
            else:
                dist.destroy_process_group()
            gc.collect()


def _send_bytes(payload: bytes, dst: int) -> None:
    data = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload else torch.empty(0, dtype=torch.uint8)
    dist.send(torch.tensor([data.numel()], dtype=torch.int64), dst)
    if data.numel():
        dist.send(data, dst)


def _recv_bytes(src: int) -> bytes:
    size = torch.zeros(1, dtype=torch.int64)
    dist.recv(size, src)
    data = torch.empty(int(size.item()), dtype=torch.uint8)
    if data.numel():
        dist.recv(data, src)
    return data.numpy().tobytes()
