"""The loop's hook contract (loop.py HookBase): a hook added in trainer_parts.py's `build_hooks` alone is called at
every point, its periodic work runs when due, its state rides in the checkpoint under "hooks" by its name
(and is read from a checkpoint that kept it flat, as checkpoints did before), and a stop leaves its due
work pending by name for the resumed run to do first. The counting engine stands in for the model; the
evaluation and validation losses are scripted (their real runs are covered elsewhere)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from maskrcnn_dist import trainer_parts
from maskrcnn_dist.checkpoint import latest_checkpoint, load_checkpoint
from maskrcnn_dist.data import load_datasets
from maskrcnn_dist.lifetime.stop import Stopped, StopRequest
from maskrcnn_dist.training import hooks
from maskrcnn_dist.training.base import Boundary, HookBase, Start
from maskrcnn_dist.training.losses import StepResult

from .conftest import fast_config
from .stand_ins import fit_counting, with_flat_hook_state

STEPS_PER_EPOCH = 2  # 4 training images, batch 2


class Tally(HookBase):
    """A hook as a user adds one: records each call with the step it came at; due every third step; the
    number of its runs is its state. `stop_at`: asks `stop` for a stop from its after_step there."""

    name = "tally"

    def __init__(self, calls: list[tuple[str, int]], stop: StopRequest | None = None, stop_at: int | None = None):
        self.calls, self.stop, self.stop_at = calls, stop, stop_at
        self.runs, self.step = 0, 0
        self.restored: Any = "never"  # the state it was given on resume

    def note(self, what: str, step: int) -> None:
        self.step = step
        self.calls.append((what, step))

    def before_train(self, start: Start) -> None:
        self.note("before_train", start.step)

    def after_step(self, at: Boundary, result: StepResult) -> None:
        self.note("after_step", at.step)
        if at.step == self.stop_at:
            assert self.stop is not None
            self.stop.request("a test")

    def is_due(self, at: Boundary) -> bool:
        return at.step % 3 == 0

    def run(self, at: Boundary) -> None:
        self.runs += 1
        self.note("run", at.step)

    def after_epoch(self, at: Boundary) -> None:
        self.note("after_epoch", at.step)

    def after_train(self) -> None:
        self.note("after_train", self.step)

    def state_dict(self) -> dict[str, Any]:
        return {"runs": self.runs}

    def load_state_dict(self, state: Any, source: Path) -> None:
        self.restored = state
        self.runs = state["runs"]


@pytest.fixture
def added(monkeypatch: pytest.MonkeyPatch):
    """added(hook): `hook` added to what trainer_parts.build_hooks returns as a user would add it there: before the
    periodic checkpoint, the last hook, so that the checkpoint holds what it did at its step."""
    monkeypatch.setattr(hooks, "evaluate", lambda *args, **kwargs: {"segm_AP": 0.5, "bbox_AP": 0.5, "images": 2.0})
    monkeypatch.setattr(hooks, "validation_loss", lambda *args, **kwargs: {"loss": 1.0})
    build = trainer_parts.build_hooks

    def add(hook: HookBase) -> HookBase:
        def build_with_it(*args: Any) -> list[HookBase]:
            *before, checkpoint = build(*args)
            assert isinstance(checkpoint, hooks.PeriodicCheckpointer)
            return [*before, hook, checkpoint]

        monkeypatch.setattr(trainer_parts, "build_hooks", build_with_it)
        return hook

    return add


def run(data: Path, out: Path, stop: StopRequest | None = None, **flags: object):
    cfg = fast_config(data, out, **{"min-size": 64, "max-size": 64, "epochs": 4, **flags})
    train_set, val_set = load_datasets(cfg)
    return fit_counting(cfg, train_set, val_set, STEPS_PER_EPOCH, stop)


def newest(out: Path) -> dict[str, Any]:
    return load_checkpoint(latest_checkpoint(out / "checkpoints"))


def test_a_hook_added_in_build_hooks_is_called_at_every_point_and_its_state_survives_a_resume(
    four_images, tmp_path, added
):
    first: list[tuple[str, int]] = []
    added(Tally(first))
    run(four_images, tmp_path, **{"max-steps": 3})
    # Step 2 ends epoch 0; step 3 is the last (an end inside epoch 1) and a multiple of 3.
    assert first == [
        ("before_train", 0),
        ("after_step", 1),
        ("after_step", 2),
        ("after_epoch", 2),
        ("after_step", 3),
        ("run", 3),
        ("after_epoch", 3),
        ("after_train", 3),
    ]
    assert newest(tmp_path)["hooks"]["tally"] == {"runs": 1}

    second: list[tuple[str, int]] = []
    tally = added(Tally(second))
    run(four_images, tmp_path, **{"max-steps": 6, "resume": "auto"})
    assert tally.restored == {"runs": 1}
    assert second[:2] == [("before_train", 3), ("after_step", 4)]
    assert ("run", 6) in second and second[-1] == ("after_train", 6)
    assert tally.runs == 2 and newest(tmp_path)["hooks"]["tally"] == {"runs": 2}


def test_a_stop_leaves_the_due_hooks_pending_by_name_and_the_resume_runs_them_first(four_images, tmp_path, added):
    """Step 3 is due for the tally and the periodic checkpoint; the stop writes the checkpoint itself, so
    only the tally is left pending, and the resumed run runs it before its first step."""
    calls: list[tuple[str, int]] = []
    stop = StopRequest()
    added(Tally(calls, stop, stop_at=3))
    with pytest.raises(Stopped):
        run(four_images, tmp_path, stop, **{"max-steps": 6, "checkpoint-period": 3})
    assert ("run", 3) not in calls
    state = newest(tmp_path)
    assert (state["step"], state["pending_hooks"], state["hooks"]["tally"]) == (3, ["tally"], {"runs": 0})

    resumed: list[tuple[str, int]] = []
    tally = added(Tally(resumed))
    run(four_images, tmp_path, **{"max-steps": 6, "checkpoint-period": 3, "resume": "auto"})
    assert resumed[:3] == [("before_train", 3), ("run", 3), ("after_step", 4)]
    assert tally.runs == 2  # the pending run at 3 and the one due at 6
    assert newest(tmp_path)["pending_hooks"] == []


def test_a_hook_named_like_a_key_of_the_run_keeps_its_state_apart_but_no_two_hooks_share_a_name(
    four_images, tmp_path, added
):
    class Model(Tally):
        name = "model"

    added(Model([]))
    run(four_images, tmp_path, **{"max-steps": 3})
    state = newest(tmp_path)
    assert state["hooks"]["model"] == {"runs": 1} and int(state["model"]["steps"]) == 3

    class Clash(HookBase):
        name = "validation"

    added(Clash())
    with pytest.raises(ValueError, match="'validation'"):
        run(four_images, tmp_path / "clash", **{"max-steps": 1})


def test_a_checkpoint_with_the_hook_state_flat_beside_the_run_resumes_with_it(four_images, tmp_path, added):
    """Checkpoints written before hook state was nested kept each hook's at the top level, by its name."""
    added(Tally([]))
    run(four_images, tmp_path, **{"max-steps": 3})
    with_flat_hook_state(latest_checkpoint(tmp_path / "checkpoints"))
    assert "hooks" not in newest(tmp_path) and newest(tmp_path)["tally"] == {"runs": 1}

    tally = added(Tally([]))
    run(four_images, tmp_path, **{"max-steps": 6, "resume": "auto"})
    assert tally.restored == {"runs": 1} and tally.runs == 2
    assert newest(tmp_path)["hooks"]["tally"] == {"runs": 2}
