"""An annotation file's store: mapped from its cache when that is valid for the file as it is now, else
read by one process while the others wait, and cached. The file is read by the first of DECODERS that
takes it (the seam for a new format). Invariant: a store is only ever built from a file every rule accepts."""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import DatasetError, one_line
from ..cache import CacheFile, CacheInvalid, cache_name, file_identity, load_or_build
from . import fast_read, json_read
from .columns import Columns
from .store import STORE_VERSION, SampleStore

log = logging.getLogger(__name__)


class Declined(Exception):  # noqa: N818 (not an error: a decoder's "not my format")
    """A decoder's word that a file is not of its format: the next decoder reads it."""


@dataclass(frozen=True)
class Decoder:
    """One way to read an annotation file: `read(path, where, kept) -> (Columns, categories)`, the columns
    judged by rules.py (columns.py says what they hold; `where` names the file in errors, `kept` takes
    the decoded objects instead of freeing them: cache.Build) and the file's category records. A decoder
    raises Declined for a file that is not of its format; other errors are the file's, unless it
    only ever accepts (`decides` False: a fast path, any failure of which passes the file on)."""

    name: str
    read: Callable[[Path, str, list[object] | None], tuple[Columns, list[dict[str, Any]]]]
    decides: bool = True


#: The formats an annotation file is read as, tried in order (the seam annotations/__init__.py names):
#: COCO by msgspec (fast; gives up at anything unusual), then COCO by json (any JSON file; its refusals
#: name the file, the record and the rule). A new format's Decoder goes before json's and declines what is
#: not its own (tests/trainer/data/test_decoders.py).
DECODERS: tuple[Decoder, ...] = (
    Decoder("coco (msgspec)", fast_read.read_columns, decides=False),
    Decoder("coco (json)", json_read.read_columns),
)


def decode(
    annotation_file: Path, where: str, kept: list[object] | None = None, decoders: Sequence[Decoder] | None = None
) -> tuple[Columns, list[dict[str, Any]]]:
    """The judged columns and the categories of `annotation_file` by the first of `decoders` (default:
    DECODERS) that takes it."""
    decoders = DECODERS if decoders is None else decoders
    for decoder in decoders:
        try:
            return decoder.read(annotation_file, where, kept)
        except Declined as e:
            log.debug("%s: not read as %s (%s)", where, decoder.name, one_line(e))
        except Exception as e:
            if decoder.decides:
                raise
            log.debug("%s: not read as %s (%s: %s)", where, decoder.name, type(e).__name__, one_line(e))
    raise DatasetError(f"{where}: not an annotation file this program reads ({', '.join(d.name for d in decoders)})")


def read_store(annotation_file: Path, kept: list[object] | None = None) -> SampleStore:
    """Read and judge an annotation file into a store: the slow path, once per change of the file when
    a cache keeps the result (open_store). `kept`: takes the parsed objects instead of freeing them
    (cache.Build)."""
    where = str(annotation_file)
    # The parse makes millions of objects, each of which triggers the cyclic collector's scans of a
    # growing heap (40% of json.load at COCO's size); JSON builds no cycles, so the scans find nothing.
    gc.disable()
    try:
        columns, categories = decode(annotation_file, where, kept)
        if kept is not None:
            kept.append(columns)
        return SampleStore.of_columns(columns, categories, where)
    finally:
        # Enabled, the collector's next pass would scan every object just made (a second at COCO's size);
        # a caller that keeps them instead of freeing them is about to exit (cache.Build): no pass needed.
        if kept is None:
            gc.enable()


def open_store(annotation_file: Path, cache_dir: Path | None, wait_s: float = 1800.0) -> SampleStore:
    """The store of `annotation_file`: mapped from its cache in `cache_dir` when that is valid for the
    file as it is now, else read (by one process; the others wait) and cached. None: no cache."""
    cache = samples_file(annotation_file, cache_dir, wait_s) if cache_dir is not None else None
    payload = load_or_build(cache, lambda kept: read_store(annotation_file, kept).chunks(), "parsed annotations")
    try:
        return SampleStore.from_buffer(payload)
    except (ValueError, KeyError, TypeError) as e:  # a verified file of a layout this code does not read
        where = cache.path if cache is not None else annotation_file
        raise DatasetError(f"{where}: cached samples do not match this program's layout ({e}); delete it") from e


def cached_store(annotation_file: Path, cache_dir: Path | None) -> SampleStore | None:
    """`annotation_file`'s store mapped from `cache_dir` when a valid cache of the file as it is now is
    there, else None: nothing is parsed, built or written (what may run before a run's folders are
    accepted: --val-fraction's carve on a restart)."""
    if cache_dir is None:
        return None
    try:
        return SampleStore.from_buffer(samples_file(annotation_file, cache_dir).read())
    except (CacheInvalid, ValueError, KeyError, TypeError):  # open_store says why, when it rebuilds it
        return None


def store_cached(annotation_file: Path, cache_dir: Path | None) -> bool:
    """Whether open_store will map `annotation_file`'s store from `cache_dir` rather than parse the file
    (by the cache's header: open_store verifies the rest)."""
    return cache_dir is not None and samples_file(annotation_file, cache_dir).made_for_key()


def samples_file(annotation_file: Path, cache_dir: Path, wait_s: float = 1800.0) -> CacheFile:
    """Where `annotation_file`'s store is cached in `cache_dir`, keyed by the file as it is now."""
    key = {"annotations": file_identity(annotation_file), "store": STORE_VERSION}
    return CacheFile(cache_dir / f"{cache_name(annotation_file)}.samples", "samples", key, wait_s)
