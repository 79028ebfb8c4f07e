"""Large annotation files parsed while torch is imported: the command line (cli/run.py) forks, before it
imports torch, a child per annotation file the run will read that has no cache yet; the child parses it
(annotations/read.py) and, once the trainer releases it, writes the cache file the trainer then maps
(cache.load_or_build waits for it rather than parsing again). docs/performance.md has the overlap's figures.
The splits it finds to know those files are the trainer's too: they are found once (ParseAhead.found_for).

Invariants:
- a refused run writes nothing: the trainer releases the children only after its flags and its output
  folder are accepted (prepare.open_data); a child never released is killed once the data is loaded or
  the run ends, and never outlives the loading;
- one process of a node parses a file ahead (the first to take its lock, cache.CacheFile.ahead_lock_path:
  ddp's ranks in one pod share it); the others wait while it is held, then read the file it wrote or,
  where it wrote none, parse the file themselves;
- the cache is keyed by the file as it was before the child read it: a file changed meanwhile is parsed again;
- only where it can gain: a run that trains (not `eval`), in a process that loads data (not a pipeline
  stage worker), with a cache folder, more than one core, for files of WORTH_FROM_BYTES or more;
- the child reports nothing: what goes wrong there (a damaged file, a full disk) the trainer's own parse
  meets and reports.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from maskrcnn_launcher.contract import PodPlan

from ..config import DataConfig, TrainConfig
from ..errors import DatasetError, UserError
from ..lifetime.cores import available_cores
from .annotations.read import read_store, samples_file
from .cache import CacheFile
from .sources import DataSources
from .sources.resolve import cache_dir, data_flags, found_sources, names_data

# Annotation files smaller than this parse in a fraction of a second: too little to overlap with anything,
# for the cost of a fork (check_ahead.py's workers start from it too).
WORTH_FROM_BYTES = 8 << 20
_WRITE = b"w"


@dataclass
class _Child:
    annotation_file: Path
    pid: int
    release_fd: int  # the pipe's end this process writes _WRITE to; closed, it tells the child to give up
    released: bool = False


class ParseAhead:
    """Children parsing annotation files ahead (none where every file is small or cached): `release()`
    lets them write their caches, `close()` kills those never released and waits for the others. Plain
    forks, not multiprocessing's: a process that exits without closing this must not wait at its exit for
    a child that waits for it. `found`: the splits found for the data flags `flags` (found_sources),
    which the trainer takes rather than finding them again (found_for)."""

    def __init__(self, children: list[_Child], found: DataSources, flags: tuple[Path | None, ...]) -> None:
        self._children = children
        self._found, self._flags = found, flags

    @property
    def files(self) -> tuple[Path, ...]:
        return tuple(child.annotation_file for child in self._children)

    def found_for(self, data: DataConfig) -> DataSources | None:
        """The splits found for `data`'s flags (None: found for other flags)."""
        return self._found if data_flags(data) == self._flags else None

    def release(self) -> None:
        """The run's flags and output folder are accepted: write what was parsed."""
        for child in self._children:
            if not child.released:
                with contextlib.suppress(OSError):  # it died: the trainer parses the file itself
                    os.write(child.release_fd, _WRITE)
                child.released = True

    def close(self) -> None:
        for child in self._children:
            if not child.released:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signal.SIGKILL)  # mid-parse or waiting: it has written nothing
            os.close(child.release_fd)
        for child in self._children:
            # A released one finishes its write (the trainer waited for it already).
            with contextlib.suppress(ChildProcessError):
                os.waitpid(child.pid, 0)
        self._children = []

    def __enter__(self) -> ParseAhead:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def released(parsing: ParseAhead | None) -> Iterator[None]:
    """Around the loading of the data: what is parsed ahead may be written, and is done when it ends."""
    if parsing is None:
        yield
        return
    parsing.release()
    try:
        yield
    finally:
        parsing.close()


def parse_ahead(
    cfg: TrainConfig, env: Mapping[str, str] = os.environ, worth_from_bytes: int | None = None
) -> ParseAhead | None:
    """Children parsing the annotation files `cfg`'s run will read (those of `worth_from_bytes`, default
    WORTH_FROM_BYTES, or more with no cache yet, and not parsed ahead by another process of this node),
    with the splits found (none may start: then only those); None where parsing ahead cannot gain, and
    where the data flags are refused (the trainer refuses them itself, in its order)."""
    least = WORTH_FROM_BYTES if worth_from_bytes is None else worth_from_bytes
    if cfg.test_only or cfg.data.synthetic_images or not names_data(cfg.data):
        return None
    folder = cache_dir(cfg, training=True)
    if folder is None or available_cores() < 2 or not _loads_data(cfg, env):
        return None
    try:
        # Found once, here, and said here: the trainer takes them (ParseAhead.found_for). The val split
        # --val-fraction carves is the trainer's: it may read the train file whole.
        sources = found_sources(cfg.data)
    except UserError:  # the trainer refuses the flags itself, in its order
        return None
    files = dict.fromkeys(source.annotations for source in sources.splits.values())
    children: list[_Child] = []
    for path in files:
        if file_size(path) >= least and (child := _start(path, folder, cfg.peers.timeout, children)) is not None:
            children.append(child)
    return ParseAhead(children, sources, data_flags(cfg.data))


def _loads_data(cfg: TrainConfig, env: Mapping[str, str]) -> bool:
    """Whether this process reads the dataset: every one but a pipeline's stage workers."""
    if cfg.engine != "pipeline":
        return True
    try:
        return PodPlan.from_env(env).role == "master"
    except Exception:  # noqa: BLE001 - no plan or a bad one: the trainer says so; nothing to parse here
        return False


def _start(annotation_file: Path, folder: Path, wait_s: float, started: list[_Child]) -> _Child | None:
    """A child parsing `annotation_file` ahead, holding its lock; None where its store is cached already,
    another process parses it ahead, or the lock cannot be made. `started`: this process's other children
    (their pipes are closed in the new one, so each sees its own end close)."""
    try:
        cache = samples_file(annotation_file, folder, wait_s)  # keyed by the file as it is before the parse
    except DatasetError:  # unreadable: the trainer says so
        return None
    if cache.made_for_key():
        return None
    try:
        lock = os.open(cache.ahead_lock_path(), os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # another process of this node parses it ahead: the trainer waits for that one
            return None
        reader, writer = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            _in_child(annotation_file, cache, reader, [writer, *(c.release_fd for c in started)])
        os.close(reader)
    finally:
        os.close(lock)  # the child's copy holds the lock until it exits
    return _Child(annotation_file, pid, writer)


def _in_child(annotation_file: Path, cache: CacheFile, release_fd: int, not_mine: list[int]) -> NoReturn:
    code = 1
    try:
        for fd in not_mine:
            os.close(fd)
        _parse_then_write(annotation_file, cache, release_fd)
        code = 0
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)  # nothing of the trainer's (atexit, finalizers) runs in its fork


def _parse_then_write(annotation_file: Path, cache: CacheFile, release_fd: int) -> None:
    """Parse, wait to be released, and write the cache (unless another process has). The parse's objects
    are never freed one by one: the child exits at once after (cache._build_and_write's reason)."""
    # The trainer decides what becomes of it (released or killed): a pod's SIGTERM stops the trainer
    # after its data is loaded, which this child's write is part of.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    kept: list[object] = []
    try:
        store = read_store(annotation_file, kept)
    except Exception:  # noqa: BLE001 - the trainer's own parse meets it and reports it
        store = None
    try:
        write = os.read(release_fd, len(_WRITE)) == _WRITE  # b"" once the trainer's end is closed
    except OSError:
        write = False
    if store is not None and write:
        with contextlib.suppress(OSError, DatasetError), cache.writer_lock():
            if not cache.made_for_key():
                cache.write(store.chunks())
    # The lock's file goes once the payload it guarded is made (left, one empty file per annotation file a
    # node ever parsed piles up in the temporary folder). No one needs it after: a later process finds the
    # payload made before it looks for the lock (`_start`; cache.py reads it first), and one that opened
    # it before this unlink waits on this process's hold of the same inode; at worst such a one parses
    # again and writes nothing.
    with contextlib.suppress(OSError, DatasetError):
        if cache.made_for_key():
            os.unlink(cache.ahead_lock_path())


def file_size(path: Path) -> int:
    """Its size in bytes; 0 where it cannot be read (its reader says why)."""
    try:
        return path.stat().st_size
    except OSError:
        return 0
