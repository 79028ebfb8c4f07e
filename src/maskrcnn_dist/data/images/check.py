"""Check every image of a split before training: a bad file must stop the job at start, with one line
naming it, not hours later inside a DataLoader worker on many GPUs.

Modes (--check-data):
    header  the file opens, is whole (image_file.open_checked: a JPEG's end marker, a PNG's chunks
            and CRCs; the formats no end marker vouches for, PNG, BMP, TIFF, WebP, GIF, ..., are
            decoded), and fits the annotation's width x height in the frame --exif-orientation
            allows (orientation.decide_frame). A JPEG is not decoded: a large set's headers take
            seconds on a few cores.
    full    decode every JPEG as well (what training will do), much slower.
    off     only that the files exist; each image's frame is decided when it is first read.
In every mode an image whose side the model's resize (--min-size, --max-size) would round to 0 px is
refused (data/images/resize.py).

The work is spread over a process pool sized to the cores this process may use; small sets are
checked in-process (starting a pool costs more than checking them). The report carries each good
image's frame (orientation.Frame), so training, evaluation, predict and the gallery read it as decided
here (in ddp, as rank 0 decided).
"""

from __future__ import annotations

import logging
import multiprocessing
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, TextIO

from ...config import CHECK_MODES, TrainConfig
from ...errors import DatasetError, one_line
from ...lifetime.cores import available_cores
from ...lifetime.heap import gc_paused
from ...lifetime.stop import detach_pool_worker
from .check_cache import VerdictCache, stamps_of
from .image_file import ImageFault, open_checked
from .orientation import AS_STORED, Frame, FrameMismatch, Oriented, frame_of, frame_size
from .resize import degenerate_size_reason

log = logging.getLogger(__name__)

MAX_LISTED = 5  # bad files quoted in the one-line error
_CHUNK = 256  # images per pool task: big enough to amortise the task's pickling
_IN_PROCESS_BELOW = 512  # fewer images than this are checked without a pool


@dataclass(frozen=True)
class ImageEntry:
    """What the annotation file says about one image (no size: a file given by itself, any size will do)."""

    image_id: int
    path: Path
    width: int | None = None
    height: int | None = None

    @property
    def annotated(self) -> tuple[int, int] | None:
        return None if self.width is None or self.height is None else (self.width, self.height)


@dataclass(frozen=True)
class CheckRules:
    """What makes an image usable: the --check-data mode, --exif-orientation, and the model's
    --min-size/--max-size (None: no model to fit, no resize check)."""

    mode: str = "header"
    exif_orientation: str = "auto"
    min_size: int | None = None
    max_size: int | None = None

    @classmethod
    def of(cls, cfg: TrainConfig, mode: str | None = None) -> CheckRules:
        """The rules a configuration trains by (`mode`: another --check-data mode)."""
        return cls(mode or cfg.data.check_data, cfg.data.exif_orientation, cfg.model.min_size, cfg.model.max_size)

    def resize_problem(self, size: tuple[int, int]) -> str | None:
        if self.min_size is None or self.max_size is None:
            return None
        return degenerate_size_reason(*size, self.min_size, self.max_size)


class ReadAhead(Protocol):
    """What the check needs of check_ahead.CheckAhead (which imports this module)."""

    def read(
        self, entries: Sequence[ImageEntry], rules: CheckRules
    ) -> tuple[dict[int, Frame | str], dict[int, Any]]: ...


class CheckedSplit(Protocol):
    """What the check needs of a split (dataset.Split): the images its annotation file lists."""

    @property
    def annotation_file(self) -> Path: ...

    def image_entries(self) -> list[ImageEntry]: ...


@dataclass(frozen=True)
class BadImage:
    image_id: int
    path: Path
    reason: str

    def __str__(self) -> str:
        return f"{self.path} (image id {self.image_id}): {self.reason}"


@dataclass(frozen=True)
class CheckReport:
    """The result of checking one split."""

    source: str  # the annotation file the entries come from
    mode: str
    checked: int
    bad: tuple[BadImage, ...]
    seconds: float
    # image id -> its frame, for every good image; none with --check-data off (each image's frame is
    # then decided when it is first read)
    frames: Mapping[int, Frame] = field(default_factory=dict)
    reused: int = 0  # verdicts taken from the cache (data/images/check_cache.py), not checked again
    read_ahead: int = 0  # of the checked, those whose files were read while the annotations were parsed

    @property
    def read_as_stored_though_turned(self) -> list[int]:
        """Images a viewer shows turned (orientation 5-8) whose annotation is in the stored frame."""
        return [iid for iid, frame in self.frames.items() if frame.read_as_stored_though_turned]

    @property
    def images_per_second(self) -> float:
        return self.checked / self.seconds if self.seconds > 0 else float("inf")

    def summary(self) -> str:
        reused = f", {self.reused} unchanged since the cached check" if self.reused else ""
        ahead = f", {self.read_ahead} read while the annotations were parsed" if self.read_ahead else ""
        return (
            f"{self.source}: {self.checked} images checked ({self.mode}{reused}{ahead}), {len(self.bad)} bad, "
            f"{self.seconds:.1f} s, {self.images_per_second:.0f} images/s"
        )


def check_image(entry: ImageEntry, rules: CheckRules) -> Frame | str | None:
    """Why `entry`'s file is unusable (a str), or the frame it is read in (None: not decided, mode off)."""
    if rules.mode == "off":
        if not entry.path.is_file():
            return "file not found"
        return rules.resize_problem(entry.annotated) if entry.annotated else None
    return decide(entry, file_facts(entry.path, rules.mode), rules)


def file_facts(path: Path, mode: str) -> Oriented | str:
    """What the check learns from the file alone, in `mode` (header or full): its frames, or why it is
    unusable. No annotation is needed: check_ahead.py reads these while the annotations are parsed."""
    try:
        with open_checked(path, decode_all=mode == "full") as (_, oriented):
            return oriented
    except ImageFault as exc:
        return str(exc)
    except Exception as exc:  # noqa: BLE001 - any other failure to read the file is a verdict on the file
        return f"cannot read image: {one_line(exc)}"


def decide(entry: ImageEntry, facts: Oriented | str, rules: CheckRules) -> Frame | str:
    """`entry`'s verdict from its file's facts (file_facts) and the size its annotation gives it."""
    if isinstance(facts, str):
        return facts
    try:
        frame = frame_of(facts, entry.annotated, rules.exif_orientation)
    except FrameMismatch as exc:
        return str(exc)
    return rules.resize_problem(frame_size(facts.stored, frame)) or frame


_Checked = tuple[int, list[BadImage], dict[int, Frame]]  # a chunk's count, bad images and frames


def _check_chunk(entries: Sequence[ImageEntry], rules: CheckRules) -> _Checked:
    bad, frames = [], {}
    for entry in entries:
        verdict = check_image(entry, rules)
        if isinstance(verdict, str):
            bad.append(BadImage(entry.image_id, entry.path, verdict))
        elif verdict is not None:  # one AS_STORED object for most images: a report pickles small
            frames[entry.image_id] = AS_STORED if verdict == AS_STORED else verdict
    return len(entries), bad, frames


# A pool worker's images and rules, given once when it starts (inherited through the fork): a task is a
# range of them: pickling every entry (its Path) into the tasks cost the trainer as much CPU as the
# workers spent checking.
_worker_entries: Sequence[ImageEntry] = ()
_worker_rules: CheckRules | None = None


def _start_worker(entries: Sequence[ImageEntry], rules: CheckRules) -> None:
    global _worker_entries, _worker_rules
    detach_pool_worker()
    _worker_entries, _worker_rules = entries, rules


def _check_range(bounds: tuple[int, int]) -> _Checked:
    assert _worker_rules is not None  # set by _start_worker
    return _check_chunk(_worker_entries[bounds[0] : bounds[1]], _worker_rules)


def check_images(
    entries: Sequence[ImageEntry],
    rules: CheckRules,
    *,
    source: str = "",
    processes: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    known: Mapping[int, Frame | str] | None = None,
    read_ahead: Mapping[int, Frame | str] | None = None,
) -> CheckReport:
    """Check `entries` by `rules`; `progress(done, total)` is called as chunks finish. `known`: verdicts
    already reached for some of them (data/images/check_cache.py), taken as they are. `read_ahead`: verdicts
    decided from files read while the annotations were parsed (data/check_ahead.py): checked, not reused."""
    if rules.mode not in CHECK_MODES:
        raise ValueError(f"check mode must be one of {CHECK_MODES}, got {rules.mode!r}")
    start = time.perf_counter()
    reused = sum(1 for entry in entries if entry.image_id in (known or {}))
    known = {**(read_ahead or {}), **(known or {})}
    todo = [entry for entry in entries if entry.image_id not in known]
    chunks = [(i, min(i + _CHUNK, len(todo))) for i in range(0, len(todo), _CHUNK)]
    processes = min(processes or available_cores(), max(len(chunks), 1))
    bad: list[BadImage] = []
    frames: dict[int, Frame] = {}
    for entry in entries:
        if (verdict := known.get(entry.image_id)) is not None:
            if isinstance(verdict, str):
                bad.append(BadImage(entry.image_id, entry.path, verdict))
            else:
                frames[entry.image_id] = verdict
    done = len(entries) - len(todo)
    for count, chunk_bad, chunk_frames in _map(todo, rules, chunks, processes if len(todo) >= _IN_PROCESS_BELOW else 1):
        bad.extend(chunk_bad)
        frames.update(chunk_frames)
        done += count
        if progress:
            progress(done, len(entries))
    order = {entry.image_id: i for i, entry in enumerate(entries)}
    bad.sort(key=lambda b: order[b.image_id])  # chunks finish in any order; report in file order
    seconds = time.perf_counter() - start
    ahead = len(entries) - len(todo) - reused
    return CheckReport(source, rules.mode, len(entries), tuple(bad), seconds, frames, reused, ahead)


def _map(
    todo: Sequence[ImageEntry], rules: CheckRules, chunks: list[tuple[int, int]], processes: int
) -> Iterable[_Checked]:
    if processes <= 1:
        yield from (_check_chunk(todo[start:end], rules) for start, end in chunks)
        return
    # fork: the children need nothing but PIL, and spawning would re-import torch in each of them.
    context = multiprocessing.get_context("fork" if sys.platform == "linux" else None)
    # Out of the trainer's process group: a SIGTERM to the group (dumb-init) must not kill a worker, whose
    # chunk would then never come back (stop.detach_pool_worker).
    with context.Pool(processes, initializer=_start_worker, initargs=(todo, rules)) as pool:
        yield from pool.imap_unordered(_check_range, chunks)


class Progress:
    """A progress bar on a terminal; a log line every 10% otherwise (a pod's log is not a terminal)."""

    def __init__(self, label: str, stream: TextIO | None = None) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.start = time.perf_counter()
        self.next_log = 0.1

    def __call__(self, done: int, total: int) -> None:
        fraction = done / total if total else 1.0
        rate = done / max(time.perf_counter() - self.start, 1e-9)
        if self.tty:
            bar = "#" * int(30 * fraction)
            end = "\n" if done >= total else ""
            self.stream.write(f"\r{self.label} [{bar:<30}] {done}/{total} {rate:.0f} images/s{end}")
            self.stream.flush()
        elif fraction >= self.next_log or done >= total:
            log.info("%s: %d/%d images (%.0f images/s)", self.label, done, total, rate)
            while self.next_log <= fraction:
                self.next_log += 0.1


def raise_if_bad(reports: Sequence[CheckReport]) -> None:
    if any(report.bad for report in reports):
        raise bad_images_error(reports)


SKIP_HINT = "fix or remove them, or pass --skip-bad-images to train without them"


def bad_images_error(reports: Sequence[CheckReport], hint: str = SKIP_HINT) -> DatasetError:
    """One line for every split with bad images: the first few files, their reasons and the count."""
    parts = []
    for report in reports:
        if report.bad:
            listed = "; ".join(str(b) for b in report.bad[:MAX_LISTED])
            more = f"; and {len(report.bad) - MAX_LISTED} more" if len(report.bad) > MAX_LISTED else ""
            parts.append(f"{report.source}: {len(report.bad)} of {report.checked} images are bad: {listed}{more}")
    return DatasetError(" | ".join(parts) + f" ({hint})")


def check_datasets(
    datasets: Sequence[CheckedSplit],
    rules: CheckRules,
    *,
    announce: bool = True,
    cache_dir: Path | None = None,
    cache_wait_s: float = 1800.0,
    ahead: ReadAhead | None = None,
) -> list[CheckReport]:
    """Check every image of each split (with a progress bar or log lines), one report per split, each
    summary logged when `announce` (check-data prints them itself: logged too, each showed twice); one
    warning per split counts the images read as stored though a viewer shows them turned. `cache_dir`:
    reuse the verdicts of images unchanged since a check cached there, and cache this one's (not in
    mode off, which only looks that the files exist). `ahead`: the files read while the annotations were
    parsed (data/check_ahead.py)."""
    reports = []
    for dataset in datasets:
        source = str(dataset.annotation_file)
        with gc_paused():  # the bookkeeping of every image: entries, stamps, cached verdicts
            entries = dataset.image_entries()
            cache, known, read = None, None, None
            if rules.mode != "off" and (cache_dir is not None or ahead is not None):
                read, stamps = ahead.read(entries, rules) if ahead is not None else ({}, {})
                stamps.update(stamps_of([entry for entry in entries if entry.image_id not in stamps]))
                if cache_dir is not None:
                    cache = VerdictCache.open(cache_dir, dataset.annotation_file, asdict(rules), cache_wait_s)
                    known = cache.known(entries, stamps)
        report = check_images(
            entries, rules, source=source, progress=Progress(f"checking {source}"), known=known, read_ahead=read
        )
        if cache and report.reused < report.checked:
            with gc_paused():
                cache.save({b.image_id: b.reason for b in report.bad}, report.frames, entries, stamps)
        if announce:
            log.info("%s", report.summary())
        if stored := report.read_as_stored_though_turned:
            log.warning(
                "%s: %d of %d images have an EXIF orientation that turns them (5-8) but are annotated in "
                "their stored frame (the annotation's width x height is the stored one): read as stored, "
                "e.g. image ids %s (--exif-orientation apply refuses them)",
                source,
                len(stored),
                report.checked,
                ", ".join(map(str, sorted(stored)[:MAX_LISTED])),
            )
        reports.append(report)
    return reports
