"""What a start costs that grows with the dataset, held by counts that come out the same on any CPU (issue 57;
benchmarks/before_after.py over bench_scale.py measures the time itself): the epoch's step loader makes
no global batch before a step needs it, and a start reads each annotation file once, a restart none."""

from __future__ import annotations

from pathlib import Path

from maskrcnn_dist.data import load_datasets, plan, write_train_val
from maskrcnn_dist.data.annotations import read
from maskrcnn_dist.data.loader import build_step_loader
from maskrcnn_dist.data.plan import BatchLayout

from ..conftest import fast_config


def _pairs(samples: list) -> tuple[list, list]:
    return list(samples), [{} for _ in samples]


def test_a_step_loader_makes_each_global_batch_when_its_step_comes(monkeypatch) -> None:
    """At COCO's size an epoch's 59k global batches, made whole at every start, resume and epoch, cost
    0.8 s of CPU and ~60k objects for the collector to scan; one step needs one."""
    made: list[int] = []
    cut = plan._cut
    monkeypatch.setattr(plan, "_cut", lambda batch, micro_batches: made.append(1) or cut(batch, micro_batches))
    steps = build_step_loader(range(20_000), BatchLayout(2, 2), epoch=0, seed=0, start_batch=10, share=(1, 2),
                              collate_fn=_pairs)  # fmt: skip
    assert made == [] and len(steps) == 5_000 - 10 and len(steps.loader) == 5_000 - 10
    batches = iter(steps)
    first = [next(batches) for _ in range(3)]
    assert [b.share.micro_batches[0].micro for b in first] == [1, 1, 1]
    # each step's global batch is made for its share and for the loader's indices: twice a step at most
    assert len(made) <= 2 * 3


def test_a_start_reads_an_annotation_file_once_and_a_restart_none(tmp_path: Path, monkeypatch) -> None:
    data = tmp_path / "coco"
    write_train_val(data, num_train=6, num_val=2, seed=1, image_size=(32, 48), max_objects=2)
    reads = tmp_path / "reads"  # the parse runs in a forked child (cache.py): a file counts across the fork
    read_store = read.read_store

    def counted(path: Path, kept: list | None = None):
        with open(reads, "a") as f:
            f.write(f"{path}\n")
        return read_store(path, kept)

    monkeypatch.setattr(read, "read_store", counted)
    cfg = fast_config(data, tmp_path / "run")
    load_datasets(cfg)
    listed = sorted(reads.read_text().splitlines())
    assert listed == [str(data / "train" / "annotations.json"), str(data / "val" / "annotations.json")]
    reads.unlink()
    load_datasets(cfg)  # the cache written: mapped, nothing parsed
    assert not reads.exists()
