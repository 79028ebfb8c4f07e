"""The leader's desk: what it reads from the store behind its decisions (the join tickets, who of an ended
generation is still here) and the lines it announces. The decisions themselves are the policy's pure
functions (membership.py): this only gathers their inputs and writes their answers."""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Iterable, Mapping

import torch.distributed as dist
from maskrcnn_launcher.contract import format_membership_line

from .membership import REFUSED, ElasticPolicy, Generation, admissions, heartbeat, stays
from .watcher import Watcher

log = logging.getLogger(__name__)


class Desk:
    """The leader's reads of the store (`watcher`: its heartbeat tracking)."""

    def __init__(self, store: dist.Store, watcher: Watcher, policy: ElasticPolicy) -> None:
        self.store, self.watcher, self.policy = store, watcher, policy
        self._joins_seen = 0
        self._tickets: dict[int, int] = {}  # the unanswered join tickets: ticket -> id

    def joiners_waiting(self, members: Collection[int]) -> bool:
        """Whether a ticket waits whose id is not a member (cheap: reads only the tickets not read yet)."""
        self._read_tickets()
        return any(m not in members for m in self._tickets.values())

    def take_joiners(self, members: Collection[int]) -> dict[int, int]:
        """The tickets admitted into a generation of `members` (membership.admissions), ticket -> id; those
        refused are answered here, so that their holders leave. A joiner that died while it waited would
        otherwise hold the next group's formation."""
        self._read_tickets()
        waiting = [t for t, m in self._tickets.items() if m not in members]
        beating = {t for t in waiting if self._beating(heartbeat(self._tickets[t], t))}
        decided = admissions(self._tickets, beating, members)
        if dead := sorted({self._tickets[t] for t, why in decided.refuse.items() if "silent" in why}):
            log.warning("elastic: members %s asked to join but fell silent: not admitted", dead)
        self.refuse(decided.refuse)
        self._tickets = dict(decided.wait)
        return decided.admit

    def refuse(self, tickets: Mapping[int, object], why: str | None = None) -> None:
        """Answer `tickets` with a refusal (`why`, else each ticket's own value): each holder leaves with it."""
        for ticket, reason in tickets.items():
            self.store.set(f"admitted/{ticket}", f"{REFUSED}{why or reason}")

    def survivors(self, old: Generation, me: int) -> list[int]:
        """The members of `old` still here (membership.stays); one that neither answers nor falls silent
        within the group's timeout is left out: if it was only slow, it joins again."""
        self.watcher.watch(None, old.members)  # keep their heartbeats tracked, stop watching `old`
        pending, staying = {m for m in old.members if m != me}, [me]
        deadline = time.monotonic() + self.policy.timeout_s
        while pending and time.monotonic() <= deadline:
            for member in sorted(pending):
                answered, gone = (self.store.check([f"g{old.number}/{key}/{member}"]) for key in ("alive", "gone"))
                verdict = stays(answered, gone, self.watcher.silent_for(member), self.policy)
                if verdict is not None:
                    staying += [member] if verdict else []
                    pending.discard(member)
            time.sleep(self.policy.poll_s if pending else 0)
        if pending:
            log.warning("elastic: members %s neither answered nor fell silent: left out", sorted(pending))
        return staying

    def announce(self, old: Generation, new: Generation, leaving: Iterable[int], steps_done: int) -> None:
        """One line per change (the contract's, which `maskrcnn-launch status` counts in the master's log)."""
        left = set(leaving)
        for member in old.members:
            if member not in new.members:
                event = "left" if member in left else "lost"
                log.warning("%s", format_membership_line(event, member, steps_done, new.size))
        for member in new.members:
            if member not in old.members:
                log.warning("%s", format_membership_line("joined", member, steps_done, new.size))

    def _read_tickets(self) -> None:
        count = self.store.add("joins", 0)
        for ticket in range(self._joins_seen + 1, count + 1):
            self._tickets[ticket] = int(self.store.get(f"join/{ticket}"))
        self._joins_seen = count

    def _beating(self, key: str) -> bool:
        """Whether the heartbeat `key` moves within the dead time (a live one moves within a beat)."""
        first = self.store.add(key, 0)
        deadline = time.monotonic() + self.policy.dead_after_s
        while time.monotonic() < deadline:
            time.sleep(self.policy.beat_s / 2)
            if self.store.add(key, 0) != first:
                return True
        return False
