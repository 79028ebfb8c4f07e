"""restartPolicy Always for a set of pod containers: the kubelet's crash-loop back-off, emulated.

StatefulSet pods can have no other restart policy. The scenarios call `tick()` from their own wait
loops: a restart is due no earlier than the back-off after the exit, and happens on the next tick.
"""

from __future__ import annotations

import logging
import time

from .docker import Cluster

log = logging.getLogger("e2e")

# The kubelet doubles the back-off after each restart, up to five minutes.
MAX_BACKOFF_S = 300.0


class Kubelet:
    """restartPolicy: Always for a set of containers, with the kubelet's crash-loop back-off
    (`base` seconds, 10 by default, doubled per restart, capped at 300 s)."""

    def __init__(self, cluster: Cluster, names: list[str], base: float) -> None:
        self.cluster, self.names, self.base = cluster, names, base
        self.restarts = {n: 0 for n in names}
        self.exits: dict[str, list[int]] = {n: [] for n in names}
        self._seen = {n: cluster.state(n).finished_at for n in names}
        self._due: dict[str, float] = {}

    def tick(self) -> None:
        now = time.monotonic()
        for name in self.names:
            state = self.cluster.state(name)
            if state.status == "exited" and state.finished_at != self._seen[name]:
                self._seen[name] = state.finished_at
                self.exits[name].append(state.exit_code)
                delay = min(self.base * 2 ** self.restarts[name], MAX_BACKOFF_S)
                self._due[name] = now + delay
                log.info("kubelet: %s exited %d; restart in %.0fs", name, state.exit_code, delay)
            if name in self._due and now >= self._due[name]:
                del self._due[name]
                self.restarts[name] += 1
                self.cluster.start(name)
