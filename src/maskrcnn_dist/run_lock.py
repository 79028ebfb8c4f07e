"""One trainer per run folder: the lock a run holds on OUTPUT_DIR/.run.lock from before it writes
anything there until it ends.

The invariant: while a process holds the lock, no other process of any machine that sees the same
folder trains or evaluates into it. Who holds it is the process that writes the run's files (its engine's
entry: `is_main_process`): the local engine's process, the pipeline's master (its stage workers write nothing),
ddp's global rank 0. ddp's other ranks, on its machine or on others, belong to that run and take nothing;
on machines that do not share the folder they write nothing into it either.

It is a POSIX record lock (fcntl.lockf), for what such a lock does that a lock file with a pid cannot:
- it ends with its process, however that ends (SIGKILL, the OOM killer): a killed run leaves no lock
  behind, and `--resume auto` starts at once;
- forked children (data-loader workers, the parse-ahead process) do not inherit it: they cannot keep a
  dead trainer's folder locked;
- NFS carries it to the server (NLM, NFSv4 locks), so trainers on two machines sharing the folder refuse
  each other. A machine that is lost holds its lock until the server expires it (an NFSv4 lease,
  90 s by default): a resume on another machine waits that long for it (LOST_HOLDER_WAIT_S).

A file system without locks (some FUSE mounts) gets one warning line, and the run goes on unlocked.

The file keeps the holder's process, host, command and start time (JSON) for the refusal to name; the
file itself stays (removing it would let two processes lock two files of one name), except where the
run made the folder and left nothing else in it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from .errors import ConfigError

log = logging.getLogger(__name__)

LOCK_FILE = ".run.lock"
#: How long a resume waits for a lock held from another machine: that machine may be lost, and its lock
#: ends only when the file server expires it (NFSv4's lease: 90 s by default).
LOST_HOLDER_WAIT_S = 120.0
_POLL_S = 1.0


def lock_path(output_dir: Path) -> Path:
    return Path(output_dir) / LOCK_FILE


@contextlib.contextmanager
def hold_run_folder(
    output_dir: Path,
    command: str,
    wait_for_other_host_s: float = 0.0,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[None]:
    """Hold `output_dir`'s lock for the body (creating the folder): a ConfigError naming the holder when
    another process holds it. `command`: what this process does there (train, eval), for a later
    refusal to name. `wait_for_other_host_s`: how long to wait when the holder is on another machine
    (a resume after that machine was lost), polling once a second."""
    output_dir = Path(output_dir)
    made = [p for p in (output_dir, *output_dir.parents) if not p.exists()]
    fd = _acquire(output_dir, command, wait_for_other_host_s, sleep, made)
    try:
        yield
    finally:
        if fd is not None:
            _release(fd, output_dir, made)


def _acquire(
    output_dir: Path, command: str, wait_s: float, sleep: Callable[[float], None], made: list[Path]
) -> int | None:
    deadline = time.monotonic() + wait_s
    waited = False
    while True:
        output_dir.mkdir(parents=True, exist_ok=True)  # again after a run that made it removed it
        fd = os.open(lock_path(output_dir), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EACCES, errno.EAGAIN):
                log.warning(
                    "--output-dir %s: this file system has no locks (%s): a second trainer there would not be refused",
                    output_dir,
                    exc.strerror or exc,
                )
                return None
            holder = read_holder(output_dir)
            if holder.get("host") == socket.gethostname() or time.monotonic() >= deadline:
                _forget(made)
                raise ConfigError(busy_message(output_dir, holder)) from None
            if not waited:
                log.warning(
                    "%s; waiting up to %.0f s for it to end (a lost machine's lock expires)",
                    busy_message(output_dir, holder),
                    wait_s,
                )
                waited = True
            sleep(_POLL_S)
            continue
        if _same_file(fd, lock_path(output_dir)):
            _write_holder(fd, command)
            return fd
        os.close(fd)  # a run that made the folder removed the file between our open and lock: again


def _same_file(fd: int, path: Path) -> bool:
    try:
        named = path.stat()
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino)


def _write_holder(fd: int, command: str) -> None:
    record = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": command,
        "since": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)


def read_holder(output_dir: Path) -> dict[str, object]:
    """What the lock file says of its holder ({} when it says nothing readable yet). Never called by the
    holder itself: closing any descriptor of the file would end a POSIX lock."""
    try:
        record = json.loads(lock_path(output_dir).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def busy_message(output_dir: Path, holder: dict[str, object]) -> str:
    """The one line that refuses a second trainer, naming the process that holds the folder."""
    if holder.get("pid") is None:
        who = "another process (starting: it has not written its name yet)"
    else:
        who = f"process {holder['pid']} on host {holder.get('host', '?')}"
        extra = ", ".join(str(holder[k]) for k in ("command", "since") if holder.get(k))
        who += f" ({extra})" if extra else ""
    return (
        f"--output-dir {output_dir} is in use: {who} holds {lock_path(output_dir)}; wait for it to end, "
        "or choose another --output-dir"
    )


def _release(fd: int, output_dir: Path, made: list[Path]) -> None:
    # A folder this run made and left empty but for the lock is removed with it: a refused or failed
    # start leaves nothing behind. (The lock is still held while the file goes: nobody else holds it.)
    if made and [p.name for p in output_dir.iterdir()] == [LOCK_FILE]:
        with contextlib.suppress(OSError):
            lock_path(output_dir).unlink()
        _forget(made)
    os.close(fd)


def _forget(made: list[Path]) -> None:
    """Remove the folders this process made, where they are still empty (innermost first)."""
    for folder in made:
        with contextlib.suppress(OSError):
            folder.rmdir()
