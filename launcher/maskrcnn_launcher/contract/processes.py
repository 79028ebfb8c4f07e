"""The processes under a supervisor, read from Linux's /proc: who its children are, whether any of them is
frozen, and how to end all of them.

A supervisor of the kit (the torchrun wrapper over its ranks, `maskrcnn-launch local` over its pods)
must reach processes that left its process group: torch's agent starts every rank in a session of its
own, so a signal to a pod's group reaches its agent and not its ranks. Both read the tree the same way,
here. Standard library only (the trainer's torchrun wrapper imports it before torch).
"""

from __future__ import annotations

import os
import signal

__all__ = ["child_pids", "end_process_tree", "parent_pid", "process_state", "process_tree", "stopped_pids"]


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of `pid`, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return None
    # pid (comm) state ppid ...: the name may hold spaces and parentheses, so split after the last ")".
    fields = stat[stat.rindex(b")") + 2 :].split()
    return fields[0].decode(), int(fields[1])


def _parents() -> dict[int, int]:
    found = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            found[int(entry.name)] = stat[1]
    return found


def process_state(pid: int) -> str | None:
    """`pid`'s state letter (R, S, T stopped, Z a zombie, ...); None once it is gone."""
    stat = _stat(pid)
    return None if stat is None else stat[0]


def parent_pid(pid: int) -> int | None:
    """`pid`'s parent; None once it is gone."""
    stat = _stat(pid)
    return None if stat is None else stat[1]


def child_pids(parent: int) -> list[int]:
    """The processes whose parent is `parent`."""
    return [pid for pid, ppid in _parents().items() if ppid == parent]


def process_tree(root: int) -> list[int]:
    """`root` and every process below it, parents before their children."""
    parents = _parents()
    tree, frontier = [root], [root]
    while frontier:
        frontier = [pid for pid, ppid in parents.items() if ppid in frontier and pid not in tree]
        tree += frontier
    return tree


def stopped_pids(root: int) -> list[int]:
    """The processes of `root`'s tree that are stopped (SIGSTOP, SIGTSTP, or traced): frozen, not busy."""
    return [pid for pid in process_tree(root) if (stat := _stat(pid)) is not None and stat[0] in ("T", "t")]


def end_process_tree(root: int) -> None:
    """SIGKILL every process of `root`'s tree, frozen ones included (SIGKILL needs no SIGCONT)."""
    for pid in reversed(process_tree(root)):  # children first: none is re-parented before it is reached
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:  # exited meanwhile
            pass
