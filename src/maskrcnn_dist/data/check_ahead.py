"""The image files read while the annotation file is parsed: what the data check learns from a file needs
no annotation (whether it is whole, its stored size, its EXIF orientation: images/check.file_facts), so
while the parse runs, processes on the cores it leaves idle list each split's image folder and read those
facts; the check then decides each image's verdict from its facts and its annotated size (check.decide)
and reads only the images the listing did not reach. docs/performance.md has the overlap's figures.

Invariants:
- a fact is used only for the path it was read from, and its verdict is cached (images/check_cache.py)
  under the file's size and modification time as they were before it was read: a file changed after its
  read is read again at the next start (within this run the loader reads the file as it is then);
- it starts only where the check will read every image (no verdicts cached for the split), in the
  process that runs the check (ddp's rank 0), in the modes that read files (not `off`);
- only the folder's own files are listed, not its sub-folders', and the reading stops when the check
  starts: the work it may waste is bounded by the parse's time, on cores that were idle.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from ..lifetime.cores import available_cores
from .annotations.read import store_cached
from .images.check import CheckRules, ImageEntry, decide, file_facts
from .images.check_cache import Stamp, VerdictCache
from .images.orientation import Frame, Oriented
from .parse_ahead import WORTH_FROM_BYTES, file_size
from .sources import DataSources

# Files a worker reads between looks at its stop message.
_POLL_EVERY = 64
# What a worker learned of one file: its size and mtime_ns before it was read, and its facts (why it is
# unusable, or its Oriented as a plain tuple: stored width, height, orientation, delivered; tuples of
# ints unpickle much faster than dataclasses).
Facts = tuple[int, int, str | tuple[int, int, int, int]]
_STOP = "stop"
_ENDING = {signal.SIGTERM, signal.SIGINT}  # what ends a worker: terminate(), a pod's SIGTERM, Ctrl-C


class CheckAhead:
    """Worker processes reading the image files of `folders` until `facts()` stops them. `processes`:
    how many (the parse keeps one core busy: by default every other core)."""

    def __init__(self, folders: Iterable[Path], mode: str, processes: int | None = None) -> None:
        self.folders = tuple(dict.fromkeys(Path(f) for f in folders))
        count = processes if processes is not None else available_cores() - 1
        context = multiprocessing.get_context("fork")
        self._workers: list[tuple[Any, Connection]] = []
        for index in range(max(count, 0)):
            mine, theirs = context.Pipe()
            worker = context.Process(
                target=_read_files, args=(self.folders, mode, index, count, theirs), daemon=True, name="check-ahead"
            )
            # A fork keeps the trainer's Python signal handlers until _read_files drops them: a SIGTERM in
            # between (close() right after the start) would run the trainer's handler in the child, and one
            # that raises would unwind the child into the trainer's own code. Blocked across the fork, it
            # waits for the child's default handlers and ends it.
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _ENDING)
            try:
                worker.start()
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            theirs.close()
            self._workers.append((worker, mine))
        self._facts: dict[str, Facts] | None = None

    def facts(self, wait_s: float = 30.0) -> dict[str, Facts]:
        """Stop the workers and gather what they read: path -> (size, mtime_ns, facts). A worker that
        does not answer within `wait_s` (killed, stuck on a dead volume) adds nothing."""
        if self._facts is not None:
            return self._facts
        for _, conn in self._workers:
            try:
                conn.send(_STOP)
            except OSError:  # it has finished, or died
                pass
        facts: dict[str, Facts] = {}
        for _, conn in self._workers:
            try:
                if conn.poll(wait_s):
                    facts.update(conn.recv())
            except (OSError, EOFError):  # died before it could say
                pass
        self.close()
        self._facts = facts
        return facts

    def finished(self, timeout: float) -> bool:
        """Whether every worker has read all its files (or died) within `timeout` seconds: for tests and
        benchmarks, which must know what facts() will hold."""
        return all(conn.poll(timeout) for _, conn in self._workers)

    def read(self, entries: Sequence[ImageEntry], rules: CheckRules) -> tuple[dict[int, Frame | str], dict[int, Stamp]]:
        """The verdicts of the `entries` whose files were read ahead, and those files' stamps as they were
        before the read (a file changed since is checked again at the next start, as after any check)."""
        facts = self.facts()
        verdicts: dict[int, Frame | str] = {}
        stamps: dict[int, Stamp] = {}
        decided: dict[tuple[Any, int | None, int | None], Frame | str] = {}  # few distinct sizes: decide each once
        for entry in entries:
            path = str(entry.path)
            if (fact := facts.get(path)) is None:
                continue
            key = (fact[2], entry.width, entry.height)
            if (verdict := decided.get(key)) is None:
                verdict = decided[key] = decide(entry, _oriented(fact[2]), rules)
            verdicts[entry.image_id] = verdict
            stamps[entry.image_id] = (path, fact[0], fact[1], entry.width, entry.height)
        return verdicts, stamps

    def close(self) -> None:
        for worker, conn in self._workers:
            conn.close()
            if worker.is_alive():
                worker.terminate()
            worker.join()
        self._workers = []

    def __enter__(self) -> CheckAhead:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_ahead(
    sources: DataSources,
    splits: Sequence[str],
    rules: CheckRules,
    cache_dir: Path | None,
    worth_from_bytes: int | None = None,
) -> CheckAhead | None:
    """Workers reading the image folders of those `splits` of `sources` whose images the check will read
    (no verdicts cached for them in `cache_dir`), while annotation files are parsed (no store cached
    for them); None where that gains nothing: mode `off`, one core, nothing to parse of
    `worth_from_bytes` (default WORTH_FROM_BYTES) or more, or nothing to check."""
    if rules.mode == "off" or available_cores() < 2:
        return None
    chosen = [source for split in splits if (source := sources.get(split)) is not None]
    to_parse = {s.annotations for s in chosen if not store_cached(s.annotations, cache_dir)}
    if sum(file_size(path) for path in to_parse) < (WORTH_FROM_BYTES if worth_from_bytes is None else worth_from_bytes):
        return None
    if cache_dir is not None:
        chosen = [s for s in chosen if not VerdictCache.written(cache_dir, s.annotations, asdict(rules))]
    return CheckAhead([s.images for s in chosen], rules.mode) if chosen else None


def _read_files(folders: Sequence[Path], mode: str, index: int, count: int, conn: Connection) -> None:
    """A worker: every `count`-th image file of the folders, from the `index`-th, until all are read or
    it is told to stop; then it sends what it read."""
    # Dies with the trainer's process group (a pod's SIGTERM): what it read is optional. (Blocked since
    # the fork, CheckAhead's reason: a signal sent meanwhile is delivered here, to the default handlers.)
    for signum in _ENDING:
        signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _ENDING)
    facts: dict[str, Facts] = {}
    try:
        paths = [path for folder in folders for path in _listing(folder)][index::count]
        for n, path in enumerate(paths):
            if n % _POLL_EVERY == 0 and conn.poll():
                break
            try:
                st = os.stat(path)
            except OSError:
                continue
            facts[path] = (st.st_size, st.st_mtime_ns, _plain(file_facts(Path(path), mode)))
        conn.send(facts)
    except (OSError, EOFError):  # the trainer has gone
        return


def _plain(facts: Oriented | str) -> str | tuple[int, int, int, int]:
    return facts if isinstance(facts, str) else (*facts.stored, facts.orientation, facts.delivered)


def _oriented(plain: str | tuple[int, int, int, int]) -> Oriented | str:
    return plain if isinstance(plain, str) else Oriented((plain[0], plain[1]), plain[2], plain[3])


def _listing(folder: Path) -> list[str]:
    """The folder's own files (not its sub-folders'), sorted: every worker lists the same."""
    try:
        with os.scandir(folder) as found:
            return sorted(e.path for e in found if e.is_file())
    except OSError:
        return []
