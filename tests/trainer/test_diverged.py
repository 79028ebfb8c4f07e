"""A diverged run fails: a non-finite validation loss or evaluation stops it like a non-finite training
loss (exit 1, the value and the step named) and never becomes best.pt; metrics.jsonl stays strict JSON."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from maskrcnn_dist.data import load_datasets
from maskrcnn_dist.errors import TrainingError, classify
from maskrcnn_dist.outputs.report import draw_report
from maskrcnn_dist.training import hooks

from .conftest import fast_config
from .stand_ins import DataParallelRank, fit_counting

STEPS_PER_EPOCH = 2  # 4 training images, batch 2 (or 2 ranks of batch 1)


def fit(
    data: Path,
    out: Path,
    val_losses: list[float],
    aps: list[float | None],
    monkeypatch: pytest.MonkeyPatch,
    engine: DataParallelRank | None = None,
) -> None:
    """Train 3 epochs with the counting engine; each epoch's validation loss and segm_AP are scripted
    (None: this rank holds no evaluation, as ranks other than 0 do)."""
    losses, values = iter(val_losses), iter(aps)
    monkeypatch.setattr(hooks, "validation_loss", lambda *a, **k: {"loss": next(losses), "loss_mask": 0.5})

    def scripted_evaluation(*args, **kwargs) -> dict[str, float] | None:
        value = next(values)
        return None if value is None else {"segm_AP": value, "bbox_AP": 0.1, "images": 2.0}

    monkeypatch.setattr(hooks, "evaluate", scripted_evaluation)
    # Two data-parallel ranks share the 4 images: batches of 1 keep 2 steps an epoch.
    batch = 2 if engine is None else 1
    cfg = fast_config(
        data, out, **{"min-size": 64, "max-size": 64, "eval-every-epoch": True, "epochs": 3, "batch-size": batch}
    )
    fit_counting(cfg, *load_datasets(cfg), STEPS_PER_EPOCH, engine=engine)


def strict_records(out: Path) -> list[dict]:
    """metrics.jsonl read as strict JSON parsers (JavaScript's, Go's) read it: no NaN or Infinity."""

    def refuse(token: str) -> None:
        raise ValueError(f"not JSON: {token}")

    return [json.loads(line, parse_constant=refuse) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(
    ("val_losses", "aps", "message"),
    [
        ([1.0, float("nan")], [0.2, 0.3], r"non-finite validation loss at step 4: loss=nan"),
        ([1.0, float("inf")], [0.2, 0.3], r"non-finite validation loss at step 4: loss=inf"),
        ([1.0, 1.0], [float("nan"), 0.3], r"non-finite evaluation at step 2: segm_AP=nan"),
    ],
)
def test_a_non_finite_validation_loss_or_evaluation_fails_the_run_without_a_best_checkpoint(
    four_images: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, val_losses, aps, message
):
    with pytest.raises(TrainingError, match=message) as raised:
        fit(four_images, tmp_path, val_losses, aps, monkeypatch)
    failure = classify(raised.value)
    assert failure is not None and failure.code == 1
    records = strict_records(tmp_path)
    bests = [r for r in records if r["kind"] == "best"]
    diverged_at = int(message.split("at step ")[1].split(":")[0])
    assert all(r["step"] < diverged_at for r in bests)
    best = tmp_path / "checkpoints" / "best.pt"
    assert not best.exists() or diverged_at > 2  # the first evaluation diverged: no best.pt at all
    bad = next(r for r in records if r["step"] == diverged_at and r.get("non_finite"))
    assert bad["non_finite"] == {("loss" if "validation" in message else "segm_AP"): message.split("=")[1]}
    draw_report(tmp_path / "metrics.jsonl", tmp_path / "report.png")  # a diverged run's report still draws


@pytest.mark.parametrize(
    ("rank", "evaluation", "others"),
    [(0, float("nan"), 0.0), (1, None, float("nan"))],
    ids=["rank 0, which evaluated", "rank 1, which received rank 0's value"],
)
def test_every_data_parallel_rank_stops_on_a_non_finite_evaluation(
    four_images: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rank, evaluation, others
):
    """With ddp only rank 0 evaluates; the value every rank agrees on is what stops them all, so that no
    rank is left waiting in a collective for one that exited."""
    engine = DataParallelRank(rank, others)
    with pytest.raises(TrainingError, match=r"non-finite evaluation at step 2: segm_AP=nan"):
        fit(four_images, tmp_path, [1.0, 1.0], [evaluation, 0.3], monkeypatch, engine)
    # Rank 0 too took its part in the all-reduce before it stopped: had it stopped on its own value,
    # rank 1 would wait in that all-reduce for ever.
    assert float(engine.reduced[-1][0]) == pytest.approx(evaluation or 0.0, nan_ok=True)
    assert not (tmp_path / "checkpoints" / "best.pt").exists()


def test_metrics_jsonl_is_strict_json_for_every_value(four_images: Path, tmp_path: Path, monkeypatch):
    fit(four_images, tmp_path, [1.0, 2.0, 3.0], [0.2, 0.3, 0.4], monkeypatch)
    records = strict_records(tmp_path)
    assert [r["segm_AP"] for r in records if r["kind"] == "eval"] == [0.2, 0.3, 0.4]
    assert all(math.isfinite(r["loss"]) for r in records if r["kind"] == "val")
