"""Placement and backend: the module order and placement rule, the process-group backend, and which
pipeline edges may carry device tensors. The topology check, the plan and the trainer's stage split
and engines apply these same rules.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "MODULES",
    "PARAMETERLESS_MODULES",
    "edge_device_map",
    "placement_problems",
    "process_group_backend",
    "validate_placement",
]

# ---------------------------------------------------------------------------------------------
# Module placement: the topology check and the trainer's stage split apply the same rule.
# ---------------------------------------------------------------------------------------------

#: The parts of torchvision's GeneralizedRCNN, in forward order. A stage is a contiguous run of
#: them; post-processing belongs to `roi_heads`' stage.
MODULES = ("transform", "backbone", "rpn", "roi_heads")
#: Modules without parameters (resize and normalise): never a stage on their own.
PARAMETERLESS_MODULES = ("transform",)

_PLACEMENT_RULE = f"a placement splits {', '.join(MODULES)} into non-empty contiguous runs, in this order"


def placement_problems(placement: Sequence[Sequence[str]], trained: bool = True) -> list[str]:
    """Every reason `placement` (module names per stage, in pipeline order) is not a split of `MODULES`
    into non-empty contiguous runs in forward order; empty when it is one.

    The stages hand each other GeneralizedRCNN.forward's local variables in its own order, so a stage
    can only be a contiguous run and the runs can only come in forward order. Stages are numbered from
    1 in the messages; unknown names are reported once each, and left out of the order check so one
    typo does not also read as "missing" and "out of order". `trained`: the stages train (each holds an
    optimizer), so none may be only parameterless modules; a profiler timing each module alone does not.
    """
    if not placement:
        return ["no stages: the placement needs at least one"]
    problems = []
    stages: list[tuple[str, ...]] = []
    for i, names in enumerate(placement, start=1):
        if isinstance(names, str):  # ["transform", ...] instead of [["transform", ...]]
            problems.append(f"stage {i} is the string {names!r}, not a list of module names")
            names = ()
        elif not names:
            problems.append(f"stage {i} is empty")
        stages.append(tuple(names))
    flat = [name for names in stages for name in names]
    unknown = list(dict.fromkeys(name for name in flat if name not in MODULES))
    problems += [f"unknown module {name!r} (the modules are {', '.join(MODULES)})" for name in unknown]
    placed = [name for name in flat if name in MODULES]
    counts_ok = True
    for module in MODULES:
        holders = [i for i, names in enumerate(stages, start=1) if module in names]
        if not holders:
            problems.append(f"module {module!r} is placed in no stage")
            counts_ok = False
        elif len(holders) > 1:
            problems.append(f"module {module!r} is placed in {len(holders)} stages")
            counts_ok = False
        elif placed.count(module) > 1:
            problems.append(f"module {module!r} is listed {placed.count(module)} times in stage {holders[0]}")
            counts_ok = False
    # A stage trains its parameters (each holds an optimizer); `transform` alone has none to train.
    for i, names in enumerate(stages, start=1):
        if trained and names and all(name in PARAMETERLESS_MODULES for name in names):
            problems.append(
                f"stage {i} holds only {', '.join(names)}, which has no parameters to train: "
                "put it in one stage with the module after it"
            )
    # Each module placed once: the stages are contiguous runs in forward order iff the concatenation
    # is the forward order itself (a gap in one stage or a swapped pair both break it).
    if counts_ok and tuple(placed) != MODULES:
        problems.append(
            f"modules out of order: {', '.join(placed)}; stages must be contiguous runs of the forward order "
            f"{', '.join(MODULES)}"
        )
    return problems


def validate_placement(placement: Sequence[Sequence[str]], trained: bool = True) -> tuple[tuple[str, ...], ...]:
    """The placement as tuples, or ValueError naming every problem (joined by "; ") and the rule."""
    problems = placement_problems(placement, trained)
    if problems:
        shown = [[names] if isinstance(names, str) else list(names) for names in placement]
        raise ValueError(f"placement {shown}: {'; '.join(problems)} ({_PLACEMENT_RULE})")
    return tuple(tuple(names) for names in placement)


# ---------------------------------------------------------------------------------------------
# Process-group backend: the plan records it, the trainer's ddp engine uses it.
# ---------------------------------------------------------------------------------------------


def process_group_backend(uses_gpu: bool, shares_gpu: bool = False) -> str:
    """nccl for processes that hold GPUs (it moves CUDA tensors without host copies), gloo otherwise
    (nccl cannot run without a GPU). `shares_gpu`: several ranks of this machine run on one GPU (more
    ranks than GPUs, e.g. a 2-process check on a one-GPU machine); nccl refuses two ranks on the same
    device, gloo all-reduces their CUDA tensors through host memory. The launcher records the backend
    in the plan, the ddp engine calls this too, so both always agree."""
    return "nccl" if uses_gpu and not shares_gpu else "gloo"


# ---------------------------------------------------------------------------------------------
# Pipeline edges: which stage outputs may cross between workers as device tensors.
# ---------------------------------------------------------------------------------------------


def edge_device_map(transport: str, sender: Sequence[str], receiver: Sequence[str]) -> dict[str, str]:
    """TensorPipe map of the pipeline edge from the stage on devices `sender` to the stage on `receiver`,
    as the sender (the caller) sets it: {sender device: receiver device}. The sender calls the receiver
    with tensors in its arguments, by value, in both directions: activations from stage k to stage k+1,
    gradients from stage k+1 back to stage k, so each edge has one map per direction (the launcher asks
    for both, swapping the arguments). Replica r maps to replica r ("identity by replica index") over
    the replicas both ends have: one-to-one, as TensorPipe requires. A sender replica the map leaves out
    sends through a covered device of its own worker (a local copy first). Empty, i.e. tensors staged
    through host memory, when `transport` is "cpu" or either end is not all CUDA devices ("auto" and
    "device_maps" map every edge between GPUs)."""
    if transport == "cpu" or not sender or not receiver:
        return {}
    if not all(d.startswith("cuda:") for d in (*sender, *receiver)):
        return {}
    return {sender[r]: receiver[r] for r in range(min(len(sender), len(receiver)))}
