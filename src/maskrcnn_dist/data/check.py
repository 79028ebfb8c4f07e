"""Check every image of a split before training: a bad file must stop the job at start, with one line
naming it, not hours later inside a DataLoader worker on many GPUs.

Modes (--check-data):
    header  the file opens, its header gives the size the annotation file says, and a JPEG/PNG ends
            with its end marker (a truncated file is caught without decoding it). PIL reads only the
            header and the tail: COCO's 118k train images take seconds on a few cores.
    full    decode every pixel as well (what training will do), much slower.
    off     only that the files exist.

The work is spread over a process pool sized to the cores this process may use; small sets are
checked in-process (starting a pool costs more than checking them).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TextIO

from PIL import Image

from ..config import CHECK_MODES
from ..errors import DatasetError
from ..stop import detach_pool_worker

log = logging.getLogger(__name__)

MAX_LISTED = 5  # bad files quoted in the one-line error
_CHUNK = 256  # images per pool task: big enough to amortise the task's pickling
_IN_PROCESS_BELOW = 512  # fewer images than this are checked without a pool
_TAIL_BYTES = 4096

# JPEG's entropy-coded data escapes every 0xFF, so EOI (FF D9) appears only as the end marker.
_END_MARKERS = {"JPEG": b"\xff\xd9", "PNG": b"IEND\xaeB`\x82"}


@dataclass(frozen=True)
class ImageEntry:
    """What the annotation file says about one image (no size: a file given by itself, any size will do)."""

    image_id: int
    path: Path
    width: int | None = None
    height: int | None = None


class CheckedDataset(Protocol):
    """What the check needs of a split (coco.CocoInstanceDataset)."""

    annotation_file: Path

    def image_entries(self) -> list[ImageEntry]: ...

    def drop_images(self, image_ids: set[int]) -> None: ...

    def __len__(self) -> int: ...


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

    @property
    def images_per_second(self) -> float:
        return self.checked / self.seconds if self.seconds > 0 else float("inf")

    def summary(self) -> str:
        return (
            f"{self.source}: {self.checked} images checked ({self.mode}), {len(self.bad)} bad, "
            f"{self.seconds:.1f} s, {self.images_per_second:.0f} images/s"
        )


def check_image(entry: ImageEntry, mode: str) -> str | None:
    """Why `entry`'s file is unusable, or None when it is good."""
    try:
        if mode == "off":
            return None if entry.path.is_file() else "file not found"
        with Image.open(entry.path) as im:  # lazy: reads the header only
            size = im.size
            if mode == "full":
                im.load()
            elif im.format in _END_MARKERS:
                reason = _truncation(im.fp, _END_MARKERS[im.format])
                if reason:
                    return reason
    except FileNotFoundError:
        return "file not found"
    except Exception as e:  # noqa: BLE001 - any failure to read the file is a verdict on the file
        return " ".join(f"cannot read image: {e}".split()) or type(e).__name__
    if entry.width is not None and size != (entry.width, entry.height):
        return f"image is {size[0]}x{size[1]} but the annotation file says {entry.width}x{entry.height}"
    return None


def _truncation(fp: object, marker: bytes) -> str | None:
    fp.seek(0, os.SEEK_END)  # type: ignore[attr-defined]
    size = fp.tell()  # type: ignore[attr-defined]
    fp.seek(max(0, size - _TAIL_BYTES))  # type: ignore[attr-defined]
    if marker not in fp.read():  # type: ignore[attr-defined]
        return "image file is truncated (no end marker)"
    return None


def _check_chunk(args: tuple[Sequence[ImageEntry], str]) -> tuple[int, list[BadImage]]:
    entries, mode = args
    bad = []
    for entry in entries:
        reason = check_image(entry, mode)
        if reason is not None:
            bad.append(BadImage(entry.image_id, entry.path, reason))
    return len(entries), bad


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def check_images(
    entries: Sequence[ImageEntry],
    mode: str = "header",
    *,
    source: str = "",
    processes: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> CheckReport:
    """Check `entries` in `mode`; `progress(done, total)` is called as chunks finish."""
    if mode not in CHECK_MODES:
        raise ValueError(f"check mode must be one of {CHECK_MODES}, got {mode!r}")
    start = time.perf_counter()
    chunks = [(entries[i : i + _CHUNK], mode) for i in range(0, len(entries), _CHUNK)]
    processes = min(processes or available_cores(), len(chunks))
    bad: list[BadImage] = []
    done = 0
    for count, chunk_bad in _map(chunks, processes if len(entries) >= _IN_PROCESS_BELOW else 1):
        bad.extend(chunk_bad)
        done += count
        if progress:
            progress(done, len(entries))
    order = {entry.image_id: i for i, entry in enumerate(entries)}
    bad.sort(key=lambda b: order[b.image_id])  # chunks finish in any order; report in file order
    return CheckReport(source, mode, len(entries), tuple(bad), time.perf_counter() - start)


def _map(chunks: list, processes: int) -> Iterable[tuple[int, list[BadImage]]]:
    if processes <= 1:
        yield from map(_check_chunk, chunks)
        return
    # fork: the children need nothing but PIL, and spawning would re-import torch in each of them.
    context = multiprocessing.get_context("fork" if sys.platform == "linux" else None)
    # Out of the trainer's process group: a SIGTERM to the group (dumb-init) must not kill a worker, whose
    # chunk would then never come back (stop.detach_pool_worker).
    with context.Pool(processes, initializer=detach_pool_worker) as pool:
        yield from pool.imap_unordered(_check_chunk, chunks)


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


def check_datasets(datasets: Sequence[CheckedDataset], mode: str) -> list[CheckReport]:
    """Check every image of each split (with a progress bar or log lines), one report per split."""
    reports = []
    for dataset in datasets:
        source = str(dataset.annotation_file)
        report = check_images(dataset.image_entries(), mode, source=source, progress=Progress(f"checking {source}"))
        log.info("%s", report.summary())
        reports.append(report)
    return reports


def settle(datasets: Sequence[CheckedDataset], reports: Sequence[CheckReport], skip_bad: bool) -> None:
    """Act on the reports (computed here or received from the rank that checked): stop with one line
    listing the bad files, or, with `skip_bad`, drop them from their split with one warning."""
    if not any(report.bad for report in reports):
        return
    if not skip_bad:
        raise_if_bad(reports)
    for dataset, report in zip(datasets, reports, strict=True):
        if report.bad:
            dataset.drop_images({b.image_id for b in report.bad})
            log.warning(
                "--skip-bad-images: training without %d of %d images of %s: %s%s",
                len(report.bad),
                report.checked,
                report.source,
                "; ".join(str(b) for b in report.bad[:MAX_LISTED]),
                "; ..." if len(report.bad) > MAX_LISTED else "",
            )
            if len(dataset) == 0:
                raise DatasetError(f"{report.source}: every image failed the data check; nothing left to use")
