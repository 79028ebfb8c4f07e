"""The checks of `make gpu-check`, in the order of what they tell per second: the step's throughput
against torchvision's loop, the pipeline with device maps (fp32, blocking launches, fp16 and bf16 stages),
amp against fp32, the CUDA-graph variant of the step, then the rest."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from .amp import check_amp, needs_bf16
from .elastic import check_ddp_elastic, needs_elastic_devices
from .engines import check_checkpoint_devices, check_ddp, check_eval_amp
from .harness import Check, Env, needs_cuda
from .pipeline import (
    check_cpu_transport,
    check_device_maps,
    check_replicas,
    check_streams,
    needs_device_maps,
    needs_replica_devices,
)
from .pipeline_amp import check_amp_stages
from .runs import run_logged
from .throughput import GRAPH_BUDGET_S, check_throughput, check_throughput_graph

INJECTED = "injected_failure"
INJECTED_HANG = "injected_hang"

CHECKS: tuple[Check, ...] = (
    Check("throughput", 120, check_throughput),
    # The pipeline's three on a GPU: about 150 s together (--only pipeline_device_maps,pipeline_streams,pipeline_amp).
    Check("pipeline_device_maps", 120, check_device_maps, needs_device_maps),
    Check("pipeline_streams", 60, check_streams, needs_cuda),
    Check("pipeline_amp", 120, check_amp_stages),
    Check("amp_bf16", 60, lambda env: check_amp(env, "bf16"), needs_bf16),
    Check("amp_fp16", 60, lambda env: check_amp(env, "fp16"), needs_cuda),
    Check("throughput_graph", GRAPH_BUDGET_S, check_throughput_graph, needs_cuda),
    Check("pipeline_cpu", 100, check_cpu_transport),
    Check("ddp", 60, check_ddp),
    Check("eval_amp", 45, check_eval_amp),
    Check("checkpoint_devices", 40, check_checkpoint_devices),
    Check("pipeline_replicas", 100, check_replicas, needs_replica_devices),
    # Last: on GPUs it needs 2 or more, and a lease's budget goes to the checks above first.
    Check("ddp_elastic", 150, check_ddp_elastic, needs_elastic_devices),
)


def check_injected(env: Env) -> dict[str, Any]:
    raise RuntimeError("injected failure (--inject-failure): the run must record it and go on")


def check_injected_hang(env: Env) -> dict[str, Any]:
    """A check that never ends, holding a process tree of its own (as ddp and the pipeline do): the
    runner must stop it at its budget, and the tree with it. The sleeper names the work folder."""
    import sys
    from pathlib import Path

    hang = [sys.executable, "-c", "import sys, time; time.sleep(600)", env.work]
    run_logged(hang, Path(env.work) / "injected-hang.log", 600, threads=1)
    return {}


# The hang's budget: twice what the injected failure's process took to start, import and raise (just
# before it, under the same load), so that its sleeper, started as soon as that, runs when the runner ends it.
INJECTED_CHECKS = (
    Check(INJECTED, 30, check_injected),
    Check(INJECTED_HANG, 2, check_injected_hang, budget_per_second_of=INJECTED),
)


def checks_for(env: Env) -> list[Check]:
    """The checks in run order, their budgets scaled by env.budget_scale; the injected failures (self-test,
    their budgets as they are) sit in the middle, before ddp."""
    checks = [replace(c, budget_s=c.budget_s * env.budget_scale) for c in CHECKS]
    if env.inject_failure:
        at = [c.name for c in checks].index("ddp")
        checks[at:at] = INJECTED_CHECKS
    return checks
