"""Checkpoint pieces of a pipeline: replica checksums and the per-stage optimizer states.

build_optimizer puts the trainable parameters, in model order, into one SGD param group. Stages
hold contiguous runs of the model's modules, so the stages' trainable parameters, concatenated in
stage order, are the local engine's list in the same order: merging the stage optimizers' states
with offset indices gives exactly the state dict a local-engine optimizer would have. Pipeline
checkpoints therefore resume in any engine, and any engine's checkpoint resumes here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..base import checksum as checksum  # the replicas' checksum is every engine's (update.py reads it here)


def _single_group(state: dict[str, Any], what: str) -> dict[str, Any]:
    groups = state["param_groups"]
    if len(groups) != 1:
        raise ValueError(f"{what}: expected one optimizer param group (build_optimizer's layout), got {len(groups)}")
    return groups[0]


def merge_optimizer_states(states: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Stage optimizers' state dicts (in stage order) -> one state dict over the whole model."""
    merged: dict[int, Any] = {}
    params: list[int] = []
    for index, state in enumerate(states):
        group = _single_group(state, f"stage {index + 1}")
        local_to_global = {local: len(params) + j for j, local in enumerate(group["params"])}
        merged.update({local_to_global[local]: value for local, value in state["state"].items()})
        params.extend(local_to_global.values())
    return {"state": merged, "param_groups": [{**_single_group(states[0], "stage 1"), "params": params}]}


def split_optimizer_state(state: dict[str, Any], counts: Sequence[int]) -> list[dict[str, Any]]:
    """Inverse of merge_optimizer_states: `counts` = trainable parameters per stage."""
    group = _single_group(state, "checkpoint optimizer")
    if len(group["params"]) != sum(counts):
        raise ValueError(
            f"checkpoint optimizer holds {len(group['params'])} parameters, the model has {sum(counts)} trainable"
        )
    parts, start = [], 0
    for count in counts:
        global_ids = group["params"][start : start + count]
        parts.append(
            {
                "state": {j: state["state"][g] for j, g in enumerate(global_ids) if g in state["state"]},
                "param_groups": [{**group, "params": list(range(count))}],
            }
        )
        start += count
    return parts
