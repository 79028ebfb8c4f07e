"""The files a run writes under its --output-dir: their names, in one place.

Torch-free on purpose: the container harness (e2e/) and tools that only read a run's results import
this module without pulling in the trainer.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable
from pathlib import Path

METRICS_FILE = "metrics.jsonl"  # metrics.py: one JSON record per line
REPORT_FILE = "report.png"  # report.py
CHECKPOINT_DIR = "checkpoints"  # checkpoint.py: checkpoint_<step>.pt, newest K kept

#: A complete checkpoint's file name; group 1 is the step.
CHECKPOINT_NAME = re.compile(r"^checkpoint_(\d{8})\.pt$")
#: The temporary file of a checkpoint being written (`.checkpoint_<step>.pt.tmp-<pid>`), renamed when complete.
CHECKPOINT_TMP_NAME = re.compile(r"^\.checkpoint_\d{8}\.pt\.tmp-\d+$")
CHECKPOINT_TMP_GLOB = ".checkpoint_*.pt.tmp-*"


def checkpoint_name(step: int) -> str:
    return f"checkpoint_{step:08d}.pt"


def checkpoint_tmp_name(step: int, pid: int) -> str:
    return f".{checkpoint_name(step)}.tmp-{pid}"


def checkpoint_dir(output_dir: Path) -> Path:
    return Path(output_dir) / CHECKPOINT_DIR


# What a training run leaves in its --output-dir (besides inputs such as a generated data/ folder):
# a new run refuses to write over them, and --overwrite moves them aside.
TENSORBOARD_DIR = "tensorboard"
GALLERY_FILE = REPORT_FILE.removesuffix(".png") + "_gallery.png"  # gallery.gallery_path
RUN_OUTPUTS = (METRICS_FILE, CHECKPOINT_DIR, TENSORBOARD_DIR, REPORT_FILE, GALLERY_FILE)
REPLACED_PREFIX = "replaced-"


def previous_run(output_dir: Path) -> list[str]:
    """What in `output_dir` shows that a run already trained there: a non-empty metrics file and the
    complete checkpoints (described for the user), or [] when nothing would be lost."""
    output_dir = Path(output_dir)
    found = []
    metrics = output_dir / METRICS_FILE
    if metrics.is_file() and metrics.stat().st_size > 0:
        found.append(METRICS_FILE)
    folder = checkpoint_dir(output_dir)
    if folder.is_dir():
        count = sum(1 for p in folder.iterdir() if CHECKPOINT_NAME.match(p.name))
        if count:
            found.append(f"{count} checkpoint(s) in {CHECKPOINT_DIR}/")
    return found


def move_aside(output_dir: Path, stamp: str, names: Iterable[str] = RUN_OUTPUTS) -> Path | None:
    """Move a previous run's outputs (`names` in `output_dir`, by default a training run's) into
    `output_dir/replaced-<stamp>/` (nothing is deleted); the folder, or None when there was nothing to move."""
    output_dir = Path(output_dir)
    present = [output_dir / name for name in dict.fromkeys(names) if (output_dir / name).exists()]
    if not present:
        return None
    target = output_dir / f"{REPLACED_PREFIX}{stamp}"
    suffix = 1
    while target.exists():  # two --overwrite runs in the same second
        target, suffix = output_dir / f"{REPLACED_PREFIX}{stamp}-{suffix}", suffix + 1
    target.mkdir()
    for path in present:
        path.rename(target / path.name)
    return target


def replaced_stamp() -> str:
    """The UTC time that names a replaced-<time>/ folder."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime())


def output_folder_problem(path: Path, flag: str) -> str | None:
    """Why the folder a flag names cannot receive output (an existing file, a file on the way to it, a
    folder this user may not write), or None. Checked before any work, so nothing is lost to it."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        return f"{flag} {path}: an existing file, not a folder"
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        return f"{flag} {path}: {existing} is a file, not a folder"
    if existing is not None and not os.access(existing, os.W_OK | os.X_OK):
        return f"{flag} {path}: {existing} is not writable by this user"
    return None


def output_file_problem(path: Path, flag: str) -> str | None:
    """Why a file a flag names cannot be written (a folder in its place, or its folder's problem), or
    None: checked before minutes of work that would be lost to it. A missing folder is created."""
    path = Path(path)
    if path.is_dir():
        return f"{flag} {path}: a folder, not a file"
    return output_folder_problem(path.parent, flag)
