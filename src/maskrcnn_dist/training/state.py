"""The run's part of a checkpoint: where training stands, what a stop left pending, the RNG, the engine's
state and every hook's, beside the facts of the run (engine, config, categories).

Every hook's state goes under one key, `hooks`, by the hook's name: `{"hooks": {"evaluation": {...}}}`,
plain types and tensors that `weights_only=True` loads. Checkpoints written before that kept each one
flat beside the run's keys (`FLAT_RUN_KEYS`), the evaluation's as `best`; they are read as they are.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch

from ..engines.base import Engine
from ..errors import CheckpointError

log = logging.getLogger(__name__)

HOOKS_KEY = "hooks"
#: The run's own keys in a checkpoint that keeps its hooks' state flat beside them (written before
#: HOOKS_KEY): none of them is a hook's state.
FLAT_RUN_KEYS = frozenset(
    {"format_version", "model", "optimizer", "scheduler", "scaler", "step", "epoch", "batch", "rng", "pending_hooks"}
    | {"engine", "config", "categories", "trained_model", "batch_layout", "world_size"}
)
#: Hook name -> the key a flat checkpoint kept its state under, where that is not the name.
FLAT_KEYS = {"evaluation": "best"}


@dataclass
class Position:
    """Where training stands: `step` optimizer steps done; the next batch is `batch` of `epoch`."""

    step: int = 0
    epoch: int = 0
    batch: int = 0

    def advance(self, iters_per_epoch: int) -> None:
        """One step on: the next batch, or the next epoch's first."""
        self.step, self.batch = self.step + 1, self.batch + 1
        if self.batch == iters_per_epoch:
            self.epoch, self.batch = self.epoch + 1, 0


class HookWithState(Protocol):
    name: str

    def state_dict(self) -> dict[str, Any] | None: ...

    def load_state_dict(self, state: Any, source: Path) -> None: ...


H = TypeVar("H", bound=HookWithState)


def pending_hooks(hooks: Sequence[H], names: Sequence[str]) -> list[H]:
    """The hooks a stop left pending, by name; a name no hook of this run has is said and skipped."""
    by_name = {hook.name: hook for hook in hooks}
    if unknown := [name for name in names if name not in by_name]:
        log.warning("resume: %s left pending, but this run has no such hook: not run", ", ".join(unknown))
    return [by_name[name] for name in names if name in by_name]


def name_problem(hooks: Sequence[HookWithState], new: HookWithState) -> str | None:
    """Why `new` cannot join `hooks`: it has no name, or another's (its state and what a stop leaves
    pending go by it)."""
    if not new.name or new.name in {h.name for h in hooks}:
        return f"hook {type(new).__name__}: name {new.name!r} is empty or another hook's"
    return None


def capture(
    engine: Engine, position: Position, pending: list[str], hooks: Sequence[HookWithState], facts: dict[str, Any]
) -> dict[str, Any]:
    hook_states = {hook.name: state for hook in hooks if (state := hook.state_dict()) is not None}
    return {
        **engine.state_dict(),
        "step": position.step,
        "epoch": position.epoch,
        "batch": position.batch,
        "pending_hooks": list(pending),
        "rng": torch.get_rng_state(),
        "engine": engine.name,
        **facts,
        HOOKS_KEY: hook_states,
    }


def restore(
    engine: Engine, hooks: Sequence[HookWithState], state: dict[str, Any], source: Path
) -> tuple[Position, list[str]]:
    """Load `state` into the engine, the RNG and every hook; returns the position and the pending hooks."""
    if state.get("engine") not in (None, engine.name):
        # Model and optimizer layouts are the same for every engine; only the schedule's position moves.
        log.info("checkpoint %s was written by the %s engine; continuing with %s", source, state["engine"], engine.name)
    try:
        engine.load_state_dict(state)
    except (KeyError, RuntimeError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {source} does not fit this model/engine: {exc}") from exc
    torch.set_rng_state(state["rng"])
    for hook in hooks:
        hook.load_state_dict(hook_state(state, hook.name), source)
    position = Position(step=int(state["step"]), epoch=int(state["epoch"]), batch=int(state["batch"]))
    return position, list(state.get("pending_hooks", []))


def hook_state(state: dict[str, Any], name: str) -> Any:
    """The state a checkpoint holds for the hook `name` (None: none), in either layout."""
    if HOOKS_KEY in state:
        return state[HOOKS_KEY].get(name)
    key = FLAT_KEYS.get(name, name)
    return None if key in FLAT_RUN_KEYS else state.get(key)
