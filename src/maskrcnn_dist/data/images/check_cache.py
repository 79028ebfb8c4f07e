"""The data check's verdicts, kept for the next start: a restart checks only the images that changed.

A verdict (the frame an image is read in, or why it is unusable) depends on the image file, the size
the annotation file gives it and the check's rules. So the cache file is one per annotation file and
set of rules (data/cache.py verifies it), and each image's verdict is reused only while its path, its
size and modification time, and its annotated width x height are what they were when it was checked.
A changed annotation file changes no verdict but those of the images whose size it changed; a new,
touched or replaced image is checked again. Missing files are never cached (a stat says so anyway).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import msgspec

from ..cache import CacheFile, CacheInvalid, cache_name
from .orientation import AS_STORED, Frame

log = logging.getLogger(__name__)

VERDICTS_VERSION = 2
Verdict = Frame | str  # a frame: usable, read in it; a string: why not
# What a verdict holds for: the image's path, its size and mtime_ns, its annotated width and height.
Stamp = tuple[str, int, int, int | None, int | None]


class CheckedImage(Protocol):
    """What this module reads of check.py's ImageEntry (check.py uses this module, not the reverse)."""

    image_id: int
    path: Path
    width: int | None
    height: int | None


@dataclass
class VerdictCache:
    """The verdicts cached for one annotation file under one set of rules."""

    file: CacheFile
    entries: dict[int, tuple[Stamp, Verdict]]

    @classmethod
    def open(
        cls, cache_dir: Path, annotation_file: Path, rules: Mapping[str, Any], wait_s: float = 1800.0
    ) -> VerdictCache:
        """What the cache holds, verified; empty (with the reason logged) when it cannot be used. `rules`:
        the check's rules as a dict (its `mode` names the file; all of them key it)."""
        file = _verdicts_file(cache_dir, annotation_file, rules, wait_s)
        try:
            entries = _decode(file.read())
        except CacheInvalid as e:
            if str(e) != "not written yet":
                log.warning("%s: cached data check not used (%s): images are checked again", file.path, e)
            entries = {}
        return cls(file, entries)

    @staticmethod
    def written(cache_dir: Path, annotation_file: Path, rules: Mapping[str, Any]) -> bool:
        """Whether verdicts for this annotation file and these rules are cached (by the file's header:
        open() verifies the rest)."""
        return _verdicts_file(cache_dir, annotation_file, rules).made_for_key()

    def known(self, entries: Sequence[CheckedImage], stamps: Mapping[int, Stamp]) -> dict[int, Verdict]:
        """The verdicts still valid for these entries (their stamps unchanged since they were checked)."""
        found = {}
        for entry in entries:
            cached = self.entries.get(entry.image_id)
            if cached is not None and entry.image_id in stamps and cached[0] == stamps[entry.image_id]:
                found[entry.image_id] = cached[1]
        return found

    def save(
        self,
        bad: Mapping[int, str],
        frames: Mapping[int, Frame],
        entries: Sequence[CheckedImage],
        stamps: Mapping[int, Stamp],
    ) -> None:
        """Record a check's verdicts (why each bad image is bad, the frame of the others) under the stamps
        taken before the check (a file changed while it was read is checked again next time) beside the
        other images' verdicts, atomically."""
        for entry in entries:
            if (stamp := stamps.get(entry.image_id)) is not None:
                self.entries[entry.image_id] = (stamp, bad.get(entry.image_id) or frames.get(entry.image_id, AS_STORED))
        try:
            with self.file.writer_lock():
                self.file.write([_encode(self.entries)])
        except OSError as e:
            log.warning("%s: cannot write the data check's cache (%s): the next start checks again", self.file.path, e)


def _verdicts_file(
    cache_dir: Path, annotation_file: Path, rules: Mapping[str, Any], wait_s: float = 1800.0
) -> CacheFile:
    key = {"annotations": str(annotation_file.resolve()), "rules": dict(rules), "version": VERDICTS_VERSION}
    return CacheFile(cache_dir / f"{cache_name(annotation_file)}.check-{rules['mode']}", "check-verdicts", key, wait_s)


def stamps_of(entries: Sequence[CheckedImage]) -> dict[int, Stamp]:
    """Each existing file's stamp (path, size, mtime_ns, annotated size); a missing one has none."""
    stamps = {}
    for entry in entries:
        try:
            st = os.stat(entry.path)
        except OSError:
            continue
        stamps[entry.image_id] = (str(entry.path), st.st_size, st.st_mtime_ns, entry.width, entry.height)
    return stamps


def _encode(entries: Mapping[int, tuple[Stamp, Verdict]]) -> bytes:
    """Columns (a JSON array per field: ~3x faster to read back than a record per image), each verdict
    an index into the few distinct ones (AS_STORED for nearly every image)."""
    verdicts: dict[Verdict, int] = {}
    rows = [(iid, *stamp, verdicts.setdefault(verdict, len(verdicts))) for iid, (stamp, verdict) in entries.items()]
    columns = [list(column) for column in zip(*rows, strict=True)] if rows else [[] for _ in range(7)]
    table = [v if isinstance(v, str) else [v.applied, v.to_display] for v in verdicts]
    return msgspec.json.encode({"columns": columns, "verdicts": table})


def _decode(payload: memoryview | bytes) -> dict[int, tuple[Stamp, Verdict]]:
    try:
        data: dict[str, Any] = msgspec.json.decode(payload)
        table = [v if isinstance(v, str) else Frame(int(v[0]), int(v[1])) for v in data["verdicts"]]
        table = [AS_STORED if v == AS_STORED else v for v in table]
        ids, paths, sizes, mtimes, widths, heights, codes = data["columns"]
        stamps = zip(paths, sizes, mtimes, widths, heights, strict=True)
        return {iid: (stamp, table[code]) for iid, stamp, code in zip(ids, stamps, codes, strict=True)}
    except (msgspec.DecodeError, ValueError, TypeError, IndexError, KeyError) as e:  # checksummed, not what this writes
        raise CacheInvalid(f"verdicts not readable ({e})") from e
