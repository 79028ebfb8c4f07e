"""The files a run writes under its --output-dir: their names, in one place, and the guard that keeps
a run from writing over another's.

Torch-free on purpose: the container harness (e2e/) and tools that only read a run's results import
this module without pulling in the trainer.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Iterable
from pathlib import Path

from .errors import ConfigError

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"  # metrics.py: one JSON record per line
#: training/samples.py: per rank, one JSON line per step with the image ids it trained on.
SAMPLES_DIR = "samples"
REPORT_FILE = "report.png"  # outputs/report.py
CHECKPOINT_DIR = "checkpoints"  # checkpoint.py: checkpoint_<step>.pt, newest K kept, and best.pt
#: The checkpoint of the best evaluation so far (best.py): never pruned, `--resume best` names it.
BEST_CHECKPOINT = "best.pt"

#: A complete checkpoint's file name; group 1 is the step. best.pt is not one of them (not pruned).
CHECKPOINT_NAME = re.compile(r"^checkpoint_(\d{8})\.pt$")
#: The temporary file of a checkpoint being written (`.checkpoint_<step>.pt.tmp-<pid>`), renamed when complete.
CHECKPOINT_TMP_NAME = re.compile(r"^\.(checkpoint_\d{8}|best)\.pt\.tmp-\d+$")  # the atomic writer's, for either
#: The temporary files of a checkpoint or of best.pt being written.
CHECKPOINT_TMP_GLOB = ".*.pt.tmp-*"


def checkpoint_name(step: int) -> str:
    return f"checkpoint_{step:08d}.pt"


def tmp_name(final_name: str, pid: int) -> str:
    """The temporary file a writer fills before renaming it to `final_name`."""
    return f".{final_name}.tmp-{pid}"


def samples_path(output_dir: Path, rank: int) -> Path:
    """The sample record of data-parallel rank `rank`: samples/rank<rank>.jsonl."""
    return Path(output_dir) / SAMPLES_DIR / f"rank{rank}.jsonl"


def checkpoint_dir(output_dir: Path) -> Path:
    return Path(output_dir) / CHECKPOINT_DIR


def best_checkpoint_path(output_dir: Path) -> Path:
    return checkpoint_dir(output_dir) / BEST_CHECKPOINT


# What a training run leaves in its --output-dir (besides inputs such as a generated data/ folder):
# a new run refuses to write over them, and --overwrite moves them aside.
TENSORBOARD_DIR = "tensorboard"
GALLERY_FILE = REPORT_FILE.removesuffix(".png") + "_gallery.png"  # outputs/gallery.gallery_path
RUN_OUTPUTS = (METRICS_FILE, SAMPLES_DIR, CHECKPOINT_DIR, TENSORBOARD_DIR, REPORT_FILE, GALLERY_FILE)
REPLACED_PREFIX = "replaced-"


def layout_problem(output_dir: Path) -> str | None:
    """Why a run cannot write its outputs into `output_dir`: a file where it keeps a folder (checkpoints/,
    tensorboard/) or a folder where it appends its metrics; found at start, not at the first checkpoint
    after the training it was to keep. None when each is absent or of the right kind."""
    for name, folder in ((METRICS_FILE, False), (CHECKPOINT_DIR, True), (TENSORBOARD_DIR, True)):
        path = Path(output_dir) / name
        if path.exists() and path.is_dir() != folder:
            return (
                f"--output-dir {output_dir}: {name} is a {'folder' if path.is_dir() else 'file'}, "
                f"where the run writes its {'folder' if folder else 'file'} of that name"
            )
    return None


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


def resume_problem(output_dir: Path, resume: Path | str | None, found: list[str], trains: bool = True) -> str | None:
    """Why resuming from `resume` into `output_dir`, which holds a run (`found`: previous_run's words),
    would write over that run, or None. A resumed run writes its checkpoints and truncates the metrics
    in `output_dir`, so it may only continue that run: from its own newest checkpoint ("auto", its
    checkpoints folder or the newest file in it). Another run's checkpoint would replace this run's files,
    and an older checkpoint of its own would replace the newer ones as training reaches their steps.
    An evaluation (`trains=False`: eval, --test-only) only appends its record to the run's metrics, so
    any checkpoint of the run's own may be evaluated there; another run's (or --weights, resume None)
    would file its AP among this run's records."""
    doing = "training there would replace its checkpoints and metrics" if trains else "its AP would join its metrics"
    if resume is None:
        return f"--output-dir {output_dir} already holds a run ({', '.join(found)}): {doing}; choose another one"
    if str(resume) in ("auto", "best"):  # shorthands for this run's own checkpoints
        return None
    folder = checkpoint_dir(output_dir).resolve()
    source = Path(resume).resolve()
    if source == folder:
        return None
    if source.parent != folder:
        return (
            f"--resume {resume} is not a checkpoint of --output-dir {output_dir}, which already holds a run "
            f"({', '.join(found)}): {doing}; choose another --output-dir"
            + (", or --resume auto to continue that run" if trains else "")
        )
    if not trains:
        return None
    newer = sorted(p.name for p in folder.iterdir() if CHECKPOINT_NAME.match(p.name) and p.name > source.name)
    if newer:
        return (
            f"--resume {resume}: {CHECKPOINT_DIR}/ in --output-dir {output_dir} holds newer checkpoints "
            f"({', '.join(newer)}) that training from this one would replace; move them out of {folder} first, "
            "or train into another --output-dir"
        )
    return None


def guard_output_dir(output_dir: Path, resume: Path | str | None, test_only: bool, overwrite: bool) -> None:
    """Never write over another run: a fresh run into an --output-dir with metrics or checkpoints is
    refused unless --resume continues it (from its own newest checkpoint) or --overwrite moves its files
    aside first. An evaluation (`test_only`) there must evaluate one of that run's own checkpoints."""
    if problem := output_folder_problem(output_dir, "--output-dir") or layout_problem(output_dir):
        raise ConfigError(problem)
    found = previous_run(output_dir)
    if not found:
        return
    if resume is not None or test_only:
        if problem := resume_problem(output_dir, resume, found, trains=not test_only):
            raise ConfigError(problem)
        return
    if not overwrite:
        raise ConfigError(
            f"--output-dir {output_dir} already holds a run ({', '.join(found)}): add --resume auto to "
            "continue it, --overwrite to move its files into a replaced-<time>/ folder there, or choose another "
            "--output-dir"
        )
    moved = move_aside(output_dir, replaced_stamp())
    log.warning("--overwrite: the previous run's files in %s were moved to %s", output_dir, moved)


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


def output_file_problem(path: Path, flag: str, suffixes: tuple[str, ...]) -> str | None:
    """Why the file a flag names cannot be written, or None. Its suffix must be one of `suffixes`: the
    writers add or switch formats by suffix (matplotlib writes `--out run` to run.png), and a file of
    another kind (a run's metrics.jsonl, a checkpoint) must never be written over by a chart or a YAML."""
    path = Path(path)
    wanted = " or ".join(suffixes)
    if path.is_dir():
        return f"{flag} {path}: a folder; give a file name ending in {wanted}"
    if path.suffix.lower() not in suffixes:
        return f"{flag} {path}: the file name must end in {wanted}"
    return output_folder_problem(path.parent, flag)
