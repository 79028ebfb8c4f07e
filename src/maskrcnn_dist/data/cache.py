"""A verified cache file: what a restart reads instead of parsing and checking again.

One file holds one payload behind a fixed-size header: a magic string, the format version, what the
payload is (`kind`), the key it was made for (e.g. the annotation file's size and modification time),
the payload's length and its CRC-32. A reader trusts nothing it has not verified: a file that is
missing, of another version or key, shorter or longer than its header says, or whose bytes do not sum
to the checksum, is not used (the caller rebuilds it, and says why).

One process writes it: writers take an exclusive lock (flock on FILE.lock), look again (another may
have written it while they waited), and write to a private temporary file renamed into place, so a
reader sees the old file or the new one, whole, never a part; the writer builds the payload in a forked
child, so the parse's garbage never stays in the trainer's heap. A process that builds the payload
ahead of the trainer's need (data/parse_ahead.py) holds a node-local lock meanwhile, and the others wait
for it before they would build. The payload is memory-mapped, read-only: every process of a node that
maps the file shares its pages.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import mmap
import multiprocessing
import os
import sys
import tempfile
import time
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import DatasetError, one_line

log = logging.getLogger(__name__)

MAGIC = b"MASKRCNN-DIST-CACHE\n"
VERSION = 1
HEADER_SIZE = 4096  # fixed: the payload starts on a page boundary, so its arrays map aligned
_CRC_CHUNK = 16 << 20


class CacheInvalid(Exception):
    """Why a cache file cannot be used (the message says so in a few words)."""


@dataclass(frozen=True)
class CacheFile:
    """Where a payload of `kind` made for `key` is kept. `wait_s`: how long a process waits for
    another that is writing it (the peers' timeout: in ddp the ranks of a node start together)."""

    path: Path
    kind: str
    key: Mapping[str, Any]
    wait_s: float = 1800.0

    def read(self) -> memoryview:
        """The verified payload, mapped read-only; CacheInvalid when it cannot be used."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError as e:
            raise CacheInvalid("not written yet") from e
        except OSError as e:
            raise CacheInvalid(f"cannot open: {one_line(e)}") from e
        try:
            size = os.fstat(fd).st_size
            header = _parse_header(os.pread(fd, HEADER_SIZE, 0))
            if not self._made_for(header):
                raise CacheInvalid("made for another file or settings (stale)")
            length = header.get("length")
            if not isinstance(length, int) or size != HEADER_SIZE + length:
                raise CacheInvalid(f"{size} bytes where the header promises {HEADER_SIZE} + {length} (truncated?)")
            if length == 0:
                return memoryview(b"")
            # Read, not through the mapping: pages touched there would count in this process's memory
            # until its DataLoader workers map them too (the whole store, for pages only they read).
            if _file_crc(fd, HEADER_SIZE, length) != header.get("crc32"):
                raise CacheInvalid("checksum mismatch (damaged)")
            mapped = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)  # a mapping keeps its own reference to the file
        return memoryview(mapped)[HEADER_SIZE:]

    def made_for_key(self) -> bool:
        """Whether a file made for this key is there, by its header alone (read() verifies the rest)."""
        try:
            with open(self.path, "rb") as f:
                header = _parse_header(f.read(HEADER_SIZE))
        except (OSError, CacheInvalid):
            return False
        return self._made_for(header)

    def _made_for(self, header: Mapping[str, Any]) -> bool:
        return header.get("kind") == self.kind and header.get("key") == _plain(self.key)

    def write(self, chunks: Iterable[bytes]) -> None:
        """Write the payload atomically: a private temporary file, synced, then renamed over the path."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp-{uuid.uuid4().hex}")
        try:
            with open(tmp, "wb") as f:
                f.write(bytes(HEADER_SIZE))
                crc, length = 0, 0
                for chunk in chunks:
                    f.write(chunk)
                    crc, length = zlib.crc32(chunk, crc), length + len(chunk)
                header = {"version": VERSION, "kind": self.kind, "key": _plain(self.key), "length": length}
                f.seek(0)
                f.write(_header_bytes({**header, "crc32": crc}))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()

    @contextlib.contextmanager
    def writer_lock(self) -> Iterator[None]:
        """Exclusive among the processes that share the folder (flock: the ranks of a node; NFSv4 and most
        network volumes pass it on to other nodes too). Waits at most `wait_s`."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
            if not _flock_within(lock.fileno(), fcntl.LOCK_EX, self.wait_s):
                raise DatasetError(
                    f"{self.path}: waited {self.wait_s:.0f} s for another process writing this cache "
                    "(--rpc-timeout); if none is running, delete the file and its .lock"
                )
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def ahead_lock_path(self) -> Path:
        """The lock a process holds while it builds this payload ahead of the trainer's need for it
        (data/parse_ahead.py). In the temporary folder, not beside the file: it is taken before the run
        may write in its folders; every process of a node (ddp's ranks in one pod) sees it."""
        where = zlib.crc32(str(self.path.resolve()).encode())
        return Path(tempfile.gettempdir()) / f"maskrcnn-dist-{where:08x}.building"

    def wait_for_builder_ahead(self) -> float | None:
        """Wait while a process of this node builds the payload ahead (it writes the file, or gives up,
        then lets go); the seconds waited, None where none was building it. At most `wait_s`: then the
        writer lock decides."""
        try:
            fd = os.open(self.ahead_lock_path(), os.O_RDONLY)
        except OSError:  # never built ahead on this node
            return None
        try:
            if _flock_within(fd, fcntl.LOCK_SH, 0):  # free at once: none is building it
                return None
            started = time.monotonic()
            _flock_within(fd, fcntl.LOCK_SH, self.wait_s)
            return time.monotonic() - started
        finally:
            os.close(fd)  # and with it the shared lock


def _flock_within(fd: int, operation: int, wait_s: float) -> bool:
    """flock `operation` on `fd`, trying every 0.1 s for at most `wait_s`; whether it was taken."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, operation | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)


# Builds a payload; a list it is given takes the objects the build made and no longer needs, for a
# caller about to exit to keep rather than free (millions of them after a JSON parse: seconds). None: this
# process goes on, and frees them (and collects garbage) as usual.
Build = Callable[[list[object] | None], Iterable[bytes]]


def load_or_build(cache: CacheFile | None, build: Build, what: str) -> memoryview | bytes:
    """The payload `cache` holds, verified; else built by `build` (in one process: the others wait and
    then read what it wrote) and written. Without a cache, or where it cannot be written, the payload is
    built and kept in memory."""
    if cache is None:
        return b"".join(build(None))
    try:
        return cache.read()
    except CacheInvalid as first:
        reason = first
    waited = cache.wait_for_builder_ahead()
    if waited is not None:
        try:
            payload = cache.read()
            log.info("%s: %s cached while this process started (waited %.1f s for it)", cache.path, what, waited)
            return payload
        except CacheInvalid as second:  # it wrote nothing (or another file): build it here
            reason = second
    try:
        with cache.writer_lock():
            try:
                return cache.read()  # written by another process while this one waited
            except CacheInvalid as second:
                reason = second
            if str(reason) != "not written yet":
                log.warning("%s: cache not used (%s): rebuilding it", cache.path, reason)
            started = time.perf_counter()
            write_in_child(cache, build)
            log.info("%s: %s cached in %.1f s", cache.path, what, time.perf_counter() - started)
    except OSError as e:  # the folder cannot be made or written (a read-only volume, a full disk)
        log.warning("%s: cannot write the cache (%s): %s kept in memory only", cache.path, one_line(e), what)
        return b"".join(build(None))
    try:
        return cache.read()
    except CacheInvalid as e:  # written and renamed by this process a moment ago: the volume lost it
        raise DatasetError(f"{cache.path}: the cache just written does not read back ({e})") from e


def write_in_child(cache: CacheFile, build: Build) -> None:
    """Build the payload and write it in a forked child. The build (a JSON parse: millions of objects)
    lives and dies there: this process's heap would keep much of it after freeing it (small objects'
    memory seldom goes back to the system), and every DataLoader worker forked later would inherit it.
    The child's DatasetError is raised here with its message; its OSError too (no cache then)."""
    if multiprocessing.current_process().daemon:  # (a pool's worker) may not start a child: build here
        cache.write(build(None))
        return
    context = multiprocessing.get_context("fork")
    reader, writer = context.Pipe(duplex=False)
    child = context.Process(target=_build_and_write, args=(cache, build, writer), daemon=True)
    child.start()
    writer.close()
    try:
        outcome = reader.recv()
    except EOFError:  # killed (out of memory?) before it could say
        outcome = ("crash", "")
    child.join()
    if outcome is None:
        return
    kind, message = outcome
    if kind == "dataset":
        raise DatasetError(message)
    if kind == "os":
        raise OSError(message)
    raise DatasetError(f"{cache.path}: building the cache failed (exit code {child.exitcode}) {message}".strip())


def _build_and_write(cache: CacheFile, build: Build, writer: Any) -> None:
    """The child: build, write, say how it went, and exit at once, the build's objects never freed one by
    one (the system takes the whole heap back: at COCO's size freeing them would cost seconds)."""
    kept: list[object] = []
    try:
        cache.write(build(kept))
        outcome: tuple[str, str] | None = None
    except DatasetError as e:
        outcome = ("dataset", str(e))
    except OSError as e:
        outcome = ("os", one_line(e))
    except Exception as e:  # noqa: BLE001 - reported by the parent, which raises it as a DatasetError
        outcome = ("error", one_line(e))
    writer.send(outcome)
    writer.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def file_identity(path: Path) -> dict[str, Any]:
    """What says a file is unchanged without reading all of it: where it is, its size and modification
    time, and a digest of its first and last MiB (a copy with a new mtime but the same bytes is still
    a change of mtime; a same-size edit within the mtime's granularity changes the digest)."""
    try:
        st = path.stat()
        with open(path, "rb") as f:
            head = f.read(1 << 20)
            f.seek(max(st.st_size - (1 << 20), 0))
            tail = f.read(1 << 20)
    except OSError as e:
        raise DatasetError(f"{path}: cannot read annotation file: {one_line(e)}") from e
    return {
        "path": str(path.resolve()),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "ends_crc32": zlib.crc32(tail, zlib.crc32(head)),
    }


def cache_name(path: Path) -> str:
    """A file name for `path`'s caches: its stem and a digest of where it is (two splits' files may share
    a name, e.g. annotations.json)."""
    where = zlib.crc32(str(path.resolve()).encode())
    return f"{path.stem}-{where:08x}"


def _file_crc(fd: int, offset: int, length: int) -> int:
    """The CRC-32 of `length` bytes of the file from `offset`; CacheInvalid if it ends before them."""
    buffer = bytearray(min(_CRC_CHUNK, length))
    crc, done = 0, 0
    while done < length:
        view = memoryview(buffer)[: min(len(buffer), length - done)]
        got = os.preadv(fd, [view], offset + done)
        if got == 0:
            raise CacheInvalid(f"ends {length - done} bytes early (truncated while read?)")
        crc = zlib.crc32(view[:got], crc)
        done += got
    return crc


def _plain(key: Mapping[str, Any]) -> Any:
    """The key as JSON gives it back (tuples become lists), so a read key compares equal."""
    return json.loads(json.dumps(key, sort_keys=True))


def _header_bytes(header: Mapping[str, Any]) -> bytes:
    text = MAGIC + json.dumps(header, sort_keys=True).encode() + b"\n"
    if len(text) > HEADER_SIZE:
        raise ValueError(f"cache header of {len(text)} bytes does not fit {HEADER_SIZE}")
    return text + bytes(HEADER_SIZE - len(text))


def _parse_header(raw: bytes) -> dict[str, Any]:
    if len(raw) < HEADER_SIZE:
        raise CacheInvalid(f"{len(raw)} bytes, shorter than its header (truncated)")
    if not raw.startswith(MAGIC):
        raise CacheInvalid("not a cache file of this program (no magic)")
    try:
        header = json.loads(raw[len(MAGIC) :].split(b"\n", 1)[0])
    except (ValueError, UnicodeDecodeError) as e:
        raise CacheInvalid("header is not readable (damaged)") from e
    if not isinstance(header, dict):
        raise CacheInvalid("header is not readable (damaged)")
    if header.get("version") != VERSION:
        raise CacheInvalid(f"format version {header.get('version')}, this program writes {VERSION}")
    return header
