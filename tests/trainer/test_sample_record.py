"""The sample record's file handling (training/samples.py): a rank that cannot write the run folder
trains on without its record, and an elastic generation's drop of uncommitted lines."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from maskrcnn_dist.training.losses import Samples
from maskrcnn_dist.training.samples import SampleRecordHook, read_samples


class Ids:
    image_ids = [100, 101, 102, 103]


def samples(rank: int) -> Samples:
    return Samples(epoch=0, batch=0, indices=(rank, rank + 2), rank=rank, world_size=2)


def test_a_rank_that_cannot_write_the_run_folder_warns_once_and_trains_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker pod's read-only mount of the run folder (the chart's default for ddp workers): here a path
    under a file, which no one (root included) can create."""
    (tmp_path / "run").write_text("a file where the run folder would be")
    hook = SampleRecordHook(tmp_path / "run" / "samples" / "rank1.jsonl", Ids(), is_main=False)
    with caplog.at_level(logging.WARNING):
        for step in (1, 2, 3):
            hook.record(step, samples(1))
        hook.drop_after(1, every_rank=False)
    warnings = [r.getMessage() for r in caplog.records if "sample record" in r.getMessage()]
    assert len(warnings) == 1 and "rank1.jsonl" in warnings[0] and "storage.workerMount" in warnings[0], warnings


def test_drop_after_keeps_committed_lines_in_every_rank_file_and_appends_after(tmp_path: Path) -> None:
    mine = SampleRecordHook(tmp_path / "samples" / "rank0.jsonl", Ids(), is_main=True)
    theirs = SampleRecordHook(tmp_path / "samples" / "rank1.jsonl", Ids(), is_main=False)
    for step in (1, 2, 3):
        mine.record(step, samples(0))
        theirs.record(step, samples(1))
    mine.drop_after(2, every_rank=True)  # the leader, as a generation forms at position 2
    assert [line["step"] for line in read_samples(tmp_path)] == [1, 1, 2, 2]
    mine.record(3, samples(0))  # its file was replaced: the hook reopens it
    lines = (tmp_path / "samples" / "rank0.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3]
    assert json.loads(lines[-1])["image_ids"] == [100, 102]
