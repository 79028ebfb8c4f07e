"""The best checkpoint and early stopping (best.py and the Trainer's evaluation hook).

Most tests drive the Trainer with a stand-in engine (a one-number model: its weight counts the steps, so
a checkpoint says which step it holds) and a scripted sequence of evaluation results: a real AP after a
few steps is too flaky to say which evaluation must win. One short run trains and evaluates for real."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from maskrcnn_dist import checkpoint, trainer_parts
from maskrcnn_dist.checkpoint import list_checkpoints, load_checkpoint
from maskrcnn_dist.data import load_datasets
from maskrcnn_dist.errors import ConfigError
from maskrcnn_dist.evaluation import METRIC_KEYS
from maskrcnn_dist.outputs import report
from maskrcnn_dist.train import train
from maskrcnn_dist.training import hooks
from maskrcnn_dist.training.best import BestTracker, agreed_value, check_best_metric
from maskrcnn_dist.training.loop import Trainer
from maskrcnn_dist.training.metrics import read_metrics

from .conftest import fast_config
from .stand_ins import fit_counting, with_flat_hook_state

STEPS_PER_EPOCH = 2  # 4 training images, batch 2


def config(data: Path, out: Path, **flags: object):
    return fast_config(data, out, **{"min-size": 64, "max-size": 64, "eval-every-epoch": True, **flags})


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch):
    """scripted(values): each evaluation returns the next value as segm_AP; validation is a stub too."""

    def install(values: list[float]) -> Iterator[float]:
        remaining = iter(values)
        monkeypatch.setattr(
            hooks, "evaluate", lambda *args, **kwargs: {"segm_AP": next(remaining), "bbox_AP": 0.0, "images": 2.0}
        )
        monkeypatch.setattr(hooks, "validation_loss", lambda *args, **kwargs: {"loss": 1.0})
        return remaining

    return install


def fit(data: Path, out: Path, **flags: object) -> Trainer:
    """Train (resume first, if asked) with the counting engine; `scripted` decides the evaluations."""
    cfg = config(data, out, **flags)
    train_set, val_set = load_datasets(cfg)
    return fit_counting(cfg, train_set, val_set, STEPS_PER_EPOCH)


def records(out: Path, kind: str) -> list[dict]:
    return [r for r in read_metrics(out / "metrics.jsonl") if r["kind"] == kind]


def best_file(out: Path) -> dict:
    """best.pt; the counting engine's is checked to hold the model of the step it says."""
    state = load_checkpoint(out / "checkpoints" / "best.pt")
    assert int(state["model"].get("steps", state["step"])) == state["step"]
    return state


# -- the tracker --------------------------------------------------------------------------------------


def test_a_tie_is_not_a_new_best_and_patience_counts_evaluations_since_the_best():
    tracker = BestTracker("segm_AP", patience=2)
    verdicts = [tracker.update(value, step) for step, value in enumerate([0.2, 0.5, 0.5, 0.6, 0.1], start=1)]
    assert verdicts == [True, True, False, True, False]
    assert (tracker.value, tracker.step, tracker.since, tracker.exhausted) == (0.6, 4, 1, False)
    tracker.update(0.6, 6)
    assert tracker.exhausted


def test_a_checkpoint_without_best_state_or_for_another_metric_starts_afresh():
    tracker = BestTracker("segm_AP")
    tracker.restore(None, "old.pt")
    tracker.restore({"metric": "bbox_AP", "value": 0.9, "step": 4, "since": 1}, "other.pt")
    assert (tracker.value, tracker.step, tracker.since) == (None, None, 0)
    tracker.restore({"metric": "segm_AP", "value": 0.3, "step": 4, "since": 2}, "ours.pt")
    assert (tracker.value, tracker.step, tracker.since) == (0.3, 4, 2)


def test_every_rank_judges_rank_0s_value():
    """Two ranks: rank 0 holds the metrics, rank 1 None; the all-reduce adds the other rank's share."""
    rank0_share = agreed_value({"segm_AP": 0.25}, "segm_AP", lambda mine: mine)
    rank1_share = agreed_value(None, "segm_AP", lambda mine: mine)
    assert (rank0_share, rank1_share) == (0.25, 0.0)
    assert agreed_value({"segm_AP": 0.25}, "segm_AP", lambda mine: mine + rank1_share) == 0.25
    assert agreed_value(None, "segm_AP", lambda mine: mine + rank0_share) == 0.25


def test_the_best_metric_must_be_one_the_evaluation_writes():
    for name in METRIC_KEYS:
        check_best_metric(name)
    with pytest.raises(ConfigError, match=r"--best-metric 'loss' .* choose one of bbox_AP, .*segm_AP50"):
        check_best_metric("loss")


# -- the Trainer, evaluations scripted ------------------------------------------------------------------


def test_best_follows_the_metric_and_pruning_keeps_best_pt(four_images, tmp_path, scripted, monkeypatch):
    scripted([0.2, 0.5, 0.5, 0.3, 0.6, 0.1])
    # The periodic checkpoint and the evaluation are due at every epoch's last step: one checkpoint, after both.
    trainer = fit(four_images, tmp_path, epochs=6, **{"keep-checkpoints": 1, "checkpoint-period": STEPS_PER_EPOCH})
    assert trainer.position.step == 12 and trainer.stopped_early is None
    assert [(r["step"], r["value"], r["metric"]) for r in records(tmp_path, "best")] == [
        (2, 0.2, "segm_AP"),
        (4, 0.5, "segm_AP"),  # the tie at step 6 keeps step 4's
        (10, 0.6, "segm_AP"),
    ]
    assert [p.name for p in list_checkpoints(tmp_path / "checkpoints")] == ["checkpoint_00000012.pt"]
    best = best_file(tmp_path)
    assert best["step"] == 10
    assert best["hooks"]["evaluation"] == {"metric": "segm_AP", "value": 0.6, "step": 10, "since": 0}
    assert load_checkpoint(tmp_path / "checkpoints")["hooks"]["evaluation"]["since"] == 1  # step 12 did not beat it
    drawn = []
    monkeypatch.setattr(report, "save_figure", lambda fig, out: drawn.append(fig) or out)
    report.draw_report(tmp_path / "metrics.jsonl", tmp_path / "report.png")
    ap_axis = drawn[0].axes[1]
    (star,) = [line for line in ap_axis.get_lines() if line.get_label().startswith("best ")]
    assert star.get_label() == "best segm_AP 0.600 (step 10, best.pt)"
    assert (list(star.get_xdata()), list(star.get_ydata())) == ([10], [0.6])


def test_one_checkpoint_a_boundary_holds_the_verdict_whatever_the_order_of_the_hooks(
    four_images, tmp_path, scripted, monkeypatch
):
    """No hook needs another to run after it: with the periodic checkpoint before the evaluation (the
    hooks in reverse), each epoch end still writes one checkpoint, after both, and best.pt holds the
    evaluation's verdict."""
    build = trainer_parts.build_hooks
    monkeypatch.setattr(trainer_parts, "build_hooks", lambda *args: list(reversed(build(*args))))
    write = checkpoint.save_checkpoint
    written: list[int] = []
    monkeypatch.setattr(
        checkpoint, "save_checkpoint", lambda state, *a: written.append(state["step"]) or write(state, *a)
    )
    scripted([0.2, 0.5, 0.1])
    fit(four_images, tmp_path, epochs=3, **{"keep-checkpoints": 5})
    assert written == [2, 4, 6]
    best = best_file(tmp_path)
    assert best["step"] == 4
    assert best["hooks"]["evaluation"] == {"metric": "segm_AP", "value": 0.5, "step": 4, "since": 0}


def test_patience_stops_after_n_evaluations_without_a_new_best(four_images, tmp_path, scripted):
    remaining = scripted([0.3, 0.2, 0.4, 0.35, 0.39, 0.9])
    trainer = fit(four_images, tmp_path, epochs=6, patience=2)
    assert trainer.position.step == 10  # the fifth evaluation is the second without a new best
    assert list(remaining) == [0.9]  # the sixth never ran
    assert trainer.stopped_early == (
        "early stop: segm_AP has not improved for 2 evaluations (--patience 2); best segm_AP 0.4000 at step 6, "
        "in best.pt"
    )
    assert max(r["step"] for r in records(tmp_path, "train")) == 10
    assert [r["step"] for r in records(tmp_path, "eval")] == [2, 4, 6, 8, 10]
    assert load_checkpoint(tmp_path / "checkpoints")["step"] == 10  # the final checkpoint, as at a normal end
    assert best_file(tmp_path)["step"] == 6


def test_best_and_patience_survive_a_resume(four_images, tmp_path, scripted):
    """Evaluations 0.5, 0.1 | resume | 0.1, 0.1 with --patience 3: the resumed run must remember both the
    best (0.1 is no new best) and the count (the stop comes after the fourth evaluation, not the fifth)."""
    scripted([0.5, 0.1, 0.1, 0.1, 0.1])
    straight = fit(four_images, tmp_path / "straight", epochs=5, patience=3)
    assert straight.position.step == 8 and straight.stopped_early is not None

    out = tmp_path / "resumed"
    scripted([0.5, 0.1])
    fit(four_images, out, epochs=5, patience=3, **{"max-steps": 4})
    scripted([0.1, 0.1, 0.1])
    resumed = fit(four_images, out, epochs=5, patience=3, resume="auto")
    assert resumed.position.step == 8
    assert resumed.stopped_early == straight.stopped_early
    assert [r["step"] for r in records(out, "best")] == [2]
    assert best_file(out)["step"] == 2


def test_best_and_patience_survive_a_resume_from_a_checkpoint_written_before_hook_state_was_nested(
    four_images, tmp_path, scripted
):
    """The same run as above, resumed from a checkpoint in the layout ce77e5b wrote: the best under "best"
    at the top level. Read anywhere else, the best would start afresh: 0.1 a new best, the stop later."""
    scripted([0.5, 0.1])
    fit(four_images, tmp_path, epochs=5, patience=3, **{"max-steps": 4})
    newest = list_checkpoints(tmp_path / "checkpoints")[-1]
    with_flat_hook_state(newest)
    assert load_checkpoint(newest)["best"] == {"metric": "segm_AP", "value": 0.5, "step": 2, "since": 1}
    scripted([0.1, 0.1, 0.1])
    resumed = fit(four_images, tmp_path, epochs=5, patience=3, resume="auto")
    assert resumed.position.step == 8 and resumed.stopped_early is not None
    assert [r["step"] for r in records(tmp_path, "best")] == [2]
    assert load_checkpoint(tmp_path / "checkpoints")["hooks"]["evaluation"]["since"] == 3


def test_a_resume_publishes_the_best_checkpoint_a_crash_left_unpublished(four_images, tmp_path, scripted):
    """The process died after writing the best evaluation's checkpoint, before best.pt."""
    scripted([0.5])
    fit(four_images, tmp_path, epochs=1)
    (tmp_path / "checkpoints" / "best.pt").unlink()
    scripted([0.1])
    fit(four_images, tmp_path, epochs=2, resume="auto")
    assert best_file(tmp_path)["step"] == 2


# -- a real evaluation ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_real_run_keeps_its_best_evaluation_and_eval_best_scores_it(four_images, tmp_path):
    out = tmp_path / "run"
    train(config(four_images, out, epochs=2, lr=0.01))
    evaluations = records(out, "eval")
    assert [r["step"] for r in evaluations] == [2, 4]
    winner = max(evaluations, key=lambda r: (r["segm_AP"], -r["step"]))  # the first of equal values
    (best,) = [r for r in records(out, "best") if r["step"] == winner["step"]]
    assert best["value"] == winner["segm_AP"] and best_file(out)["step"] == winner["step"]
    again = train(config(four_images, out, resume="best", **{"test-only": True}))
    assert again.eval["segm_AP"] == winner["segm_AP"]
    assert json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["kind"] == "eval"
