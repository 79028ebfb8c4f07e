"""Files read while the annotations are parsed (data/check_ahead.py): the verdicts they give are the check's
own, for every kind of file; a file changed after its read is read again at the next start; a worker that
dies adds nothing; and the workers start only where they gain something."""

from __future__ import annotations

import io
import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from PIL import Image

from maskrcnn_dist.data import check_ahead, write_train_val
from maskrcnn_dist.data.annotations.read import open_store
from maskrcnn_dist.data.check_ahead import CheckAhead, read_ahead
from maskrcnn_dist.data.images import check
from maskrcnn_dist.data.images.check import CheckRules, ImageEntry, check_datasets
from maskrcnn_dist.data.prepare import check_split
from maskrcnn_dist.data.sources import DataSources, SplitSource

from ..conftest import fast_config
from .photos import encode, shown_photo, stored_for

# image name -> what the check must say of it (a reason's words, or the frame's applied orientation)
EXPECTED = {
    "good.png": 1,
    "turned.jpg": 6,  # stored turned under EXIF 6, annotated as a viewer shows it
    "cut.png": "truncated",
    "cut.jpg": "truncated",
    "text.png": "cannot read image",
    "small.png": "image is 10x10 but the annotation file says",
    "swapped.png": "image is 60x40 but the annotation file says",  # good.png's facts, another annotation
    "thin.png": "image is too thin for the model",
    "missing.png": "file not found",
}
SIZE = (60, 40)


@dataclass
class Split:
    """What check_datasets needs of a split (data/images/check.py CheckedSplit)."""

    annotation_file: Path
    entries: list[ImageEntry]
    frames: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.annotation_file)

    def image_entries(self) -> list[ImageEntry]:
        return list(self.entries)

    def drop_images(self, image_ids: set[int]) -> None: ...

    def use_frames(self, frames: dict) -> None:
        self.frames.update(frames)

    def __len__(self) -> int:
        return len(self.entries)


def _every_kind(folder: Path) -> Split:
    """A folder with a file of every kind EXPECTED names, and their entries (annotated SIZE, thin 256x1)."""
    folder.mkdir(parents=True)
    Image.new("RGB", SIZE, (9, 90, 9)).save(folder / "good.png")
    (folder / "turned.jpg").write_bytes(encode(stored_for(shown_photo(SIZE), 6), "jpeg-exif", 6))
    png = (folder / "good.png").read_bytes()
    (folder / "cut.png").write_bytes(png[: len(png) // 2])
    jpeg = io.BytesIO()
    shown_photo(SIZE).save(jpeg, "JPEG")  # noise: half of it is past the headers
    (folder / "cut.jpg").write_bytes(jpeg.getvalue()[: len(jpeg.getvalue()) // 2])
    (folder / "text.png").write_text("not an image\n")
    Image.new("RGB", (10, 10)).save(folder / "small.png")
    Image.new("RGB", SIZE, (9, 90, 9)).save(folder / "swapped.png")
    Image.new("RGB", (256, 1)).save(folder / "thin.png")
    entries = [
        ImageEntry(k + 1, folder / name, *{"thin.png": (256, 1), "swapped.png": SIZE[::-1]}.get(name, SIZE))
        for k, name in enumerate(EXPECTED)
    ]
    annotations = folder.parent / "annotations.json"
    annotations.write_text("{}")
    return Split(annotations, entries)


RULES = {mode: CheckRules(mode, min_size=96, max_size=96) for mode in ("header", "full")}


def _said(report: check.CheckReport, split: Split) -> dict[str, object]:
    names = {entry.image_id: entry.path.name for entry in split.entries}
    said: dict[str, object] = {names[b.image_id]: b.reason for b in report.bad}
    said.update({names[iid]: frame.applied for iid, frame in report.frames.items()})
    return said


def _read_whole(folder: Path, mode: str, processes: int = 2) -> CheckAhead:
    ahead = CheckAhead([folder], mode, processes=processes)
    assert ahead.finished(timeout=60)
    return ahead


@pytest.mark.parametrize("mode", ["header", "full"])
def test_the_verdicts_read_ahead_are_the_checks_own(tmp_path: Path, mode: str) -> None:
    split = _every_kind(tmp_path / "images")
    (checked,) = check_datasets([split], RULES[mode])
    with _read_whole(split.entries[0].path.parent, mode) as ahead:
        (ahead_report,) = check_datasets([split], RULES[mode], ahead=ahead)
    assert ahead_report.read_ahead == len(EXPECTED) - 1  # the missing file is not in the folder: checked here
    for said in (_said(checked, split), _said(ahead_report, split)):
        assert said.keys() == EXPECTED.keys()
        for name, expected in EXPECTED.items():
            assert expected in said[name] if isinstance(expected, str) else said[name] == expected, name
    assert _said(ahead_report, split) == _said(checked, split)
    assert [b.image_id for b in ahead_report.bad] == [b.image_id for b in checked.bad]  # in file order


def test_a_file_changed_after_its_read_is_read_again_at_the_next_start(tmp_path: Path) -> None:
    split = _every_kind(tmp_path / "images")
    good = tmp_path / "images" / "good.png"
    with _read_whole(good.parent, "header") as ahead:
        ahead.facts()
        png = good.read_bytes()
        good.write_bytes(png[: len(png) // 2])  # after its read: this start's verdict is the one it read
        os.utime(good, ns=(1, 1))
        (first,) = check_datasets([split], RULES["header"], cache_dir=tmp_path / "cache", ahead=ahead)
    assert _said(first, split)["good.png"] == 1
    (second,) = check_datasets([split], RULES["header"], cache_dir=tmp_path / "cache")
    assert "truncated" in _said(second, split)["good.png"]
    # all but the changed and the missing file, and the thin one (refused for the model's sizes alone:
    # no verdict on its file is cached, data/images/check_cache.py)
    assert second.reused == len(EXPECTED) - 3


def test_a_worker_that_died_adds_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    split = _every_kind(tmp_path / "images")
    (checked,) = check_datasets([split], RULES["header"])
    monkeypatch.setattr(check_ahead, "file_facts", lambda *_: time.sleep(60))  # killed before any read ends
    with CheckAhead([tmp_path / "images"], "header", processes=2) as ahead:
        for worker, _ in ahead._workers:
            os.kill(worker.pid, signal.SIGKILL)
        (report,) = check_datasets([split], RULES["header"], ahead=ahead)
    assert report.read_ahead == 0
    assert _said(report, split) == _said(checked, split)


def _many_pngs(tmp_path: Path, count: int) -> Path:
    """A folder of `count` tiny PNG files: more than a worker reads before it is stopped."""
    folder = tmp_path / "many"
    folder.mkdir()
    png = io.BytesIO()
    Image.new("RGB", (8, 8)).save(png, "PNG")
    for k in range(count):
        (folder / f"{k:05d}.png").write_bytes(png.getvalue())
    return folder


def test_the_workers_stop_when_the_check_starts(tmp_path: Path) -> None:
    folder = _many_pngs(tmp_path, 3000)
    ahead = CheckAhead([folder], "full", processes=1)
    facts = ahead.facts(wait_s=30)  # at once: the worker has read only some of them
    assert len(facts) < 3000
    assert all(not worker.is_alive() for worker, _ in ahead._workers)


def _sources(root: Path) -> DataSources:
    return DataSources("flags", {"train": SplitSource(root / "train" / "annotations.json", root / "train" / "images")})


def test_the_workers_start_only_where_they_gain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "coco"
    write_train_val(root, num_train=6, num_val=2, seed=1, image_size=(48, 64), max_objects=2)
    sources, rules, cache = _sources(root), CheckRules("header"), tmp_path / "cache"
    assert read_ahead(sources, ["train"], rules, None) is None  # a small file parses in no time
    with read_ahead(sources, ["train"], rules, None, worth_from_bytes=0) as ahead:
        assert isinstance(ahead, CheckAhead) and ahead.folders == (root / "train" / "images",)
    assert read_ahead(sources, ["train"], CheckRules("off"), None, worth_from_bytes=0) is None
    assert read_ahead(sources, ["val"], rules, None, worth_from_bytes=0) is None  # no such split
    monkeypatch.setattr(check_ahead, "available_cores", lambda: 1)
    assert read_ahead(sources, ["train"], rules, None, worth_from_bytes=0) is None  # no idle core
    monkeypatch.undo()
    # Verdicts cached: the check reads nothing, nothing to read ahead.
    cfg = fast_config(root, tmp_path / "run")
    check_datasets([check_split(cfg, ["train"])[0].splits["train"]], rules, cache_dir=cache)
    assert read_ahead(sources, ["train"], rules, cache, worth_from_bytes=0) is None
    with read_ahead(sources, ["train"], CheckRules("full"), cache, worth_from_bytes=1) as ahead:
        assert ahead is not None  # other rules: no verdicts cached for them, and the file is to be parsed
    # The file's store cached: nothing is parsed, so no time to read in.
    open_store(sources.splits["train"].annotations, cache)
    assert read_ahead(sources, ["train"], CheckRules("full"), cache, worth_from_bytes=1) is None


def test_check_data_reads_ahead_and_judges_alike(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "coco"
    write_train_val(root, num_train=10, num_val=4, seed=1, image_size=(48, 64), max_objects=2)
    images = root / "train" / "images"
    (images / "000003.png").write_bytes((images / "000003.png").read_bytes()[:100])
    cfg = fast_config(root, tmp_path / "run")
    _, plain = check_split(cfg, ["train", "val"])
    monkeypatch.setattr(check_ahead, "WORTH_FROM_BYTES", 0)
    # Every file read before the check takes the facts: how many a reader gets through while a dozen
    # annotations parse is a race with its start (a loaded machine: none, the check reads them all itself).
    facts = CheckAhead.facts

    def facts_once_read(self: CheckAhead, wait_s: float = 30.0) -> dict:
        assert self.finished(120), "the readers did not finish within 120 s"
        return facts(self, wait_s)

    monkeypatch.setattr(CheckAhead, "facts", facts_once_read)
    _, ahead = check_split(cfg, ["train", "val"])
    assert [r.read_ahead for r in plain] == [0, 0]
    assert [r.read_ahead for r in ahead] == [10, 4]
    assert "10 read while the annotations were parsed" in ahead[0].summary()
    for one, other in zip(plain, ahead, strict=True):
        assert [(b.image_id, b.reason) for b in one.bad] == [(b.image_id, b.reason) for b in other.bad]
        assert one.frames == other.frames
    assert [b.image_id for b in ahead[0].bad] == [3]
    json.loads((root / "train" / "annotations.json").read_text())  # the set itself untouched


def test_a_worker_ended_at_its_start_dies_by_the_signal_not_by_the_trainers_handler(tmp_path: Path) -> None:
    """The fork keeps this process's Python handlers until the worker drops them; a SIGTERM from close()
    in between must not run them there (one that raises unwound a worker into pytest's own loop, where it
    hung its parent's join: check_ahead.py blocks the signal across the fork)."""
    folder = _many_pngs(tmp_path, 2000)  # still reading when it is ended

    def trainers_handler(signum, frame):
        raise SystemExit(99)

    previous = signal.signal(signal.SIGTERM, trainers_handler)
    try:
        codes = []
        for _ in range(10):
            ahead = CheckAhead([folder], "header", processes=1)
            ((worker, _conn),) = ahead._workers
            ahead.close()  # terminate() at once, while the child may still be starting
            codes.append(worker.exitcode)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert codes == [-signal.SIGTERM] * 10, codes
