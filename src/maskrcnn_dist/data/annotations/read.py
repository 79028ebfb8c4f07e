"""An annotation file's store: mapped from its cache when that is valid for the file as it is now, else
read (by msgspec, or by json where msgspec gives up: the rules judge both alike) by one process while the
others wait, and cached. Invariant: a store is only ever built from a file every rule accepts."""

from __future__ import annotations

import gc
import logging
from pathlib import Path

from ...errors import DatasetError, one_line
from ..cache import CacheFile, cache_name, file_identity, load_or_build
from . import fast_read, json_read
from .store import STORE_VERSION, SampleStore

log = logging.getLogger(__name__)


def read_store(annotation_file: Path, kept: list[object] | None = None) -> SampleStore:
    """Read and judge a COCO instances file into a store: the slow path, once per change of the file when
    a cache keeps the result (open_store). `kept`: takes the parsed objects instead of freeing them
    (cache.Build)."""
    where = str(annotation_file)
    # The parse makes millions of objects, each of which triggers the cyclic collector's scans of a
    # growing heap (40% of json.load at COCO's size); JSON builds no cycles, so the scans find nothing.
    gc.disable()
    try:
        try:
            columns, categories = fast_read.read_columns(annotation_file, where, kept)
        except Exception as e:  # noqa: BLE001 - the fast path only accepts; json and the rules decide
            log.debug("%s: read with json (%s: %s)", where, type(e).__name__, one_line(e))
            columns, categories = json_read.read_columns(annotation_file, where, kept)
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


def store_cached(annotation_file: Path, cache_dir: Path | None) -> bool:
    """Whether open_store will map `annotation_file`'s store from `cache_dir` rather than parse the file
    (by the cache's header: open_store verifies the rest)."""
    return cache_dir is not None and samples_file(annotation_file, cache_dir).made_for_key()


def samples_file(annotation_file: Path, cache_dir: Path, wait_s: float = 1800.0) -> CacheFile:
    """Where `annotation_file`'s store is cached in `cache_dir`, keyed by the file as it is now."""
    key = {"annotations": file_identity(annotation_file), "store": STORE_VERSION}
    return CacheFile(cache_dir / f"{cache_name(annotation_file)}.samples", "samples", key, wait_s)
