"""Checkpoints: written atomically (temporary file, fsync, rename) or not at all; newest K kept, and
best.pt (the best evaluation's checkpoint, best.py) beside them, never pruned.

A checkpoint is a dict of plain types and tensors, so it loads with `weights_only=True` (no
arbitrary unpickling of files that may come from a shared volume).
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .errors import CheckpointError, UserError, one_line
from .run_dir import (
    BEST_CHECKPOINT,
    CHECKPOINT_NAME,
    CHECKPOINT_TMP_GLOB,
    best_checkpoint_path,
    checkpoint_dir,
    checkpoint_name,
    tmp_name,
)

log = logging.getLogger(__name__)

FORMAT_VERSION = 1


class Checkpointer:
    """A training run's checkpoint folder: written by the main process only (`enabled`), the newest
    `keep` kept, one write per step unless asked `again` (a stop or a resume changes what it holds)."""

    def __init__(self, directory: Path, keep: int, enabled: bool) -> None:
        self.directory, self.keep, self.enabled = Path(directory), keep, enabled
        self.written_step: int | None = None

    def save(self, state: Callable[[], dict[str, Any]], step: int, again: bool = False) -> Path:
        """Write `state()` as `step`'s checkpoint; every process gets its path."""
        path = checkpoint_path(self.directory, step)
        if not self.enabled or (not again and self.written_step == step):
            return path
        save_checkpoint(state(), self.directory, step, self.keep)
        self.written_step = step
        log.info("saved %s", path)
        return path

    def trial(self, state: dict[str, Any]) -> None:
        """What a checkpoint write costs here, without a checkpoint to show for it (grace.py)."""
        trial_write(state, self.directory)

    def publish_best(self, checkpoint: Path) -> Path:
        return publish_best(checkpoint)


def checkpoint_path(directory: Path, step: int) -> Path:
    return Path(directory) / checkpoint_name(step)


def list_checkpoints(directory: Path) -> list[Path]:
    """Complete checkpoints, oldest first. Temporary files of an interrupted write are not listed."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if CHECKPOINT_NAME.match(p.name))


def latest_checkpoint(directory: Path) -> Path | None:
    found = list_checkpoints(directory)
    return found[-1] if found else None


def save_checkpoint(state: dict[str, Any], directory: Path, step: int, keep: int) -> Path:
    """Write `state` for `step`; a crash at any moment leaves either the old set or the new file."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    _remove_dead_writers_files(directory)
    final = checkpoint_path(directory, step)

    _replace_atomically(final, lambda tmp: _write(state, tmp, final))
    # best.pt does not match CHECKPOINT_NAME: pruning never reaches it.
    for old in list_checkpoints(directory)[:-keep]:
        old.unlink(missing_ok=True)
    return final


def trial_write(state: dict[str, Any], directory: Path) -> None:
    """Write `state` as save_checkpoint would, to a temporary file that is then removed: what a checkpoint
    costs on this volume (grace.py), without a checkpoint to show for it."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    # a dead writer's file if this process dies here: the next save removes it
    tmp = directory / tmp_name(checkpoint_name(0), os.getpid())
    try:
        _write(state, tmp)
    finally:
        tmp.unlink(missing_ok=True)


def publish_best(checkpoint: Path) -> Path:
    """Make `checkpoint` (one just written) its folder's best.pt, atomically like a checkpoint: a hard
    link (no second copy on disk, no second write: pruning `checkpoint` later leaves best.pt whole), or a
    copy where the file system has no hard links."""
    checkpoint = Path(checkpoint)
    _remove_dead_writers_files(checkpoint.parent)

    def link(tmp: Path) -> None:
        try:
            os.link(checkpoint, tmp)
        except OSError:
            shutil.copyfile(checkpoint, tmp)
            with open(tmp, "rb") as handle:
                os.fsync(handle.fileno())

    best = checkpoint.parent / BEST_CHECKPOINT
    _replace_atomically(best, link)
    return best


def resolve_resume(resume: Path | str | None, output_dir: Path, must_exist: bool = False) -> Path | None:
    """The checkpoint `--resume` names: a file or folder as given, "auto" the newest in
    OUTPUT_DIR/checkpoints (None when there is none yet: a fresh start; an error with `must_exist`, for the
    tools that read a model), "best" OUTPUT_DIR/checkpoints/best.pt (which must exist)."""
    if resume is None:
        return None
    if str(resume) == "auto":
        newest = latest_checkpoint(checkpoint_dir(output_dir))
        if newest is None and must_exist:
            raise CheckpointError(f"--resume auto: {checkpoint_dir(output_dir)} holds no checkpoint (--output-dir)")
        return newest
    if str(resume) == "best":
        best = best_checkpoint_path(output_dir)
        if not best.is_file():
            raise CheckpointError(
                f"--resume best: {best} does not exist (--output-dir {output_dir}): training writes it at its "
                "first evaluation; give --output-dir of a run that has evaluated, or --resume CHECKPOINT"
            )
        return best
    return Path(resume)


def _remove_dead_writers_files(directory: Path) -> None:
    """A writer killed mid-write (SIGKILL, OOM, node loss) leaves its temporary file; only the main
    process writes here, so any such file is a dead writer's: remove it before writing anew."""
    for stale in directory.glob(CHECKPOINT_TMP_GLOB):
        stale.unlink(missing_ok=True)


def _replace_atomically(final: Path, fill: Callable[[Path], None]) -> None:
    """`fill` a temporary file beside `final`, then rename it over `final` and make the rename durable."""
    tmp = final.with_name(tmp_name(final.name, os.getpid()))
    try:
        fill(tmp)
        os.replace(tmp, final)
        _fsync_dir(final.parent)
    finally:
        tmp.unlink(missing_ok=True)


def _write(state: dict[str, Any], path: Path, final: Path | None = None) -> None:
    """Write `state` to `path` (the temporary file beside `final`, the name a failure is reported under)."""
    try:
        with open(path, "wb") as handle:
            torch.save({"format_version": FORMAT_VERSION, **state}, handle)
            handle.flush()
            os.fsync(handle.fileno())
    except (OSError, RuntimeError) as failure:
        raise CheckpointError(_write_failure(path, final or path, failure)) from failure


# Below this, a failed write is taken for a full volume even when torch hid the errno behind its own
# RuntimeError ("unexpected pos ..."), as it does when the write fails inside its zip writer.
NEARLY_FULL_BYTES = 64 << 20


def _write_failure(path: Path, final: Path, failure: BaseException) -> str:
    """Why writing `path` failed, in words: a full volume names what is free and what was written, since
    a checkpoint that does not fit is the usual cause (a small PVC, a node's ephemeral storage)."""
    chain: list[BaseException] = []
    cause: BaseException | None = failure
    while cause is not None and cause not in chain:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    full = any(isinstance(c, OSError) and c.errno in (errno.ENOSPC, errno.EDQUOT) for c in chain)
    try:
        free = shutil.disk_usage(path.parent).free
        written = path.stat().st_size if path.is_file() else 0
    except OSError:
        free, written = None, 0
    if full or (free is not None and free < NEARLY_FULL_BYTES):
        room = f"{free / 2**20:.0f} MiB free" if free is not None else "no space left"
        return (
            f"cannot write checkpoint {final}: its volume is full ({room} after {written / 2**20:.0f} MiB of it); "
            "the checkpoints already written are kept: free space there, lower --keep-checkpoints or give an "
            "--output-dir on a larger volume"
        )
    return f"cannot write checkpoint {final}: {one_line(failure)}"


def checkpoint_file(path: Path) -> Path:
    """The checkpoint file `--resume` names: the file itself, or the newest one in a directory."""
    path = Path(path)
    if path.is_dir():
        newest = latest_checkpoint(path)
        if newest is None:
            raise CheckpointError(f"--resume {path}: the directory holds no checkpoint_*.pt file")
        path = newest
    if not path.is_file():
        raise CheckpointError(f"--resume {path}: no such file")
    return path


def load_resume(resume: Path | str | None, output_dir: Path) -> tuple[dict[str, Any], Path] | None:
    """The checkpoint `--resume` names (resolve_resume), loaded, and its file; None: a fresh start."""
    source = resolve_resume(resume, output_dir)
    if source is None:
        if resume is not None:
            log.info("resume auto: no checkpoint in %s yet, starting fresh", checkpoint_dir(output_dir))
        return None
    source = checkpoint_file(source)
    return load_checkpoint(source), source


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load a checkpoint file or the newest one in a directory, with weights_only=True."""
    path = checkpoint_file(path)
    state = read_torch_file(path, "checkpoint", CheckpointError)
    if not isinstance(state, dict) or state.get("format_version") != FORMAT_VERSION or "model" not in state:
        raise CheckpointError(f"checkpoint {path} is not a maskrcnn-dist checkpoint (format {FORMAT_VERSION})")
    log.info("loaded checkpoint %s (step %s)", path, state.get("step"))
    return state


# torch.save writes a zip archive; files from torch < 1.6 are a pickle stream (protocol 2+ opcode).
_TORCH_FILE_MAGIC = (b"PK\x03\x04", b"\x80")


def read_torch_file(path: Path, what: str, error: type[UserError]) -> Any:
    """torch.load(path) with weights_only=True, on CPU. Anything that is not a readable torch file raises
    `error` naming `what` and the file: torch's own message for a text file is a bare KeyError ('101')."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(4)
    except OSError as exc:
        raise error(f"{what} file {path}: {exc.strerror or exc}") from exc
    if not head.startswith(_TORCH_FILE_MAGIC):
        kind = "empty" if not head else f"starts with {head!r}"
        raise error(f"{what} file {path} is not a PyTorch file (torch.save writes a zip archive; this one {kind})")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # truncated, foreign or tampered files raise many types
        raise error(f"{what} file {path} cannot be read: {one_line(exc)}") from exc


def _fsync_dir(directory: Path) -> None:
    """Make the rename itself durable (it lives in the directory's metadata)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
