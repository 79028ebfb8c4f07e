"""A start's first step is recorded at once, whatever --print-freq: the losses stay on the device between
records (training/losses.py), and the first record is what says that the data, the model and the loader
work. Issue 57: with records only every --print-freq steps, the first train record of a start came 20
steps late (3.3x json.load at COCO's size instead of 1.2x, the resume 2.8x slower)."""

from __future__ import annotations

from pathlib import Path

from maskrcnn_dist.data import load_datasets
from maskrcnn_dist.training import hooks
from maskrcnn_dist.training.metrics import read_metrics

from .conftest import fast_config
from .stand_ins import CountingEngine, fit_counting

STEPS_PER_EPOCH = 8  # 16 training images, batch 2: no epoch end (whose work reads the steps) before step 8


class RecordWatcher(CountingEngine):
    """The counting engine, noting as each step starts the train steps metrics.jsonl holds."""

    def __init__(self, metrics: Path) -> None:
        super().__init__()
        self.metrics, self.seen = metrics, []

    def train_step(self, step, images, targets):
        recorded = read_metrics(self.metrics) if self.metrics.is_file() else []
        self.seen.append((step + 1, [r["step"] for r in recorded if r["kind"] == "train"]))
        return super().train_step(step, images, targets)


def run(data: Path, out: Path, **flags: object) -> list[tuple[int, list[int]]]:
    """(step, the train steps recorded as it starts) for each step of a fit."""
    cfg = fast_config(data, out, **{"min-size": 64, "max-size": 64, "print-freq": 20, **flags})
    engine = RecordWatcher(out / "metrics.jsonl")
    fit_counting(cfg, *load_datasets(cfg), STEPS_PER_EPOCH, engine=engine)
    return engine.seen


def test_the_first_step_of_a_start_and_of_a_resume_is_recorded_before_the_next_one(stop_coco, tmp_path, monkeypatch):
    # the last step's validation and evaluation, scripted
    monkeypatch.setattr(hooks, "validation_loss", lambda *a, **k: {"loss": 1.0})
    monkeypatch.setattr(hooks, "evaluate", lambda *a, **k: {"segm_AP": 0.1, "bbox_AP": 0.1, "images": 2.0})
    first = run(stop_coco, tmp_path, **{"max-steps": 4})
    # step 1's record is there when step 2 starts; the rest wait for a record boundary (the last step here)
    assert first == [(1, []), (2, [1]), (3, [1]), (4, [1])]
    resumed = run(stop_coco, tmp_path, **{"max-steps": 8, "resume": "auto"})
    assert resumed == [(5, [1, 2, 3, 4]), (6, [1, 2, 3, 4, 5]), (7, [1, 2, 3, 4, 5]), (8, [1, 2, 3, 4, 5])]
