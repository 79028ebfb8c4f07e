"""The throughput part of the check: benchmarks/bench_gpu_step.py (a benchmark, run as one) within its
share of the run's budget (it leaves out what would not end in it); its table and figures become the
check's."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from .harness import Env
from .runs import run_logged

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_gpu_step.py"


# Seconds of the check's budget kept for the benchmark's start (imports, CUDA) and its report.
START_AND_REPORT_S = 25.0


# The CUDA-graph variant's check: the graphed backbone beside the padded rows it builds on and
# torchvision's loop (bench_gpu_step.py's variants), within its own budget.
GRAPH_VARIANTS = ("tv_amp_bf16", "kit_amp_bf16_padded", "kit_amp_bf16_graph")
GRAPH_BUDGET_S = 100.0


def check_throughput(env: Env) -> dict[str, Any]:
    """images/s, step memory and host waits of the kit's local engine (batched heads and torchvision's)
    and of torchvision's loop, under amp; a profile of two steps (CUDA). Fails only when the benchmark
    does."""
    return run_benchmark(env, "throughput", env.throughput_budget_s)


def check_throughput_graph(env: Env) -> dict[str, Any]:
    """The same with fixed canvases and the backbone replayed as CUDA graphs (modeling/canvas.py)."""
    return run_benchmark(env, "throughput_graph", GRAPH_BUDGET_S, GRAPH_VARIANTS)


def run_benchmark(env: Env, name: str, budget_s: float, variants: tuple[str, ...] = ()) -> dict[str, Any]:
    out = Path(env.work) / name
    report = out / "bench_gpu_step.json"
    # The benchmark leaves out what would not end in its budget: the scaled one (the hang guard's), so that a
    # busy machine under the self-test's --budget-scale cannot leave out every round and with it the figures.
    budget_s *= env.budget_scale
    command = [sys.executable, str(SCRIPT), "--device", env.device, "--json-out", str(report)]
    command += ["--time-budget", str(max(10.0, budget_s - START_AND_REPORT_S))]
    command += ["--rounds", str(env.profile.throughput_rounds)]
    command += ["--variants", ",".join(variants)] if variants else []
    log = run_logged(command, out / "bench.log", budget_s, threads=env.profile.threads or 2)
    table = log[: log.index("{\n")] if "{\n" in log else log
    (out / "table.md").write_text(table)
    figures = json.loads(report.read_text())
    return {"headline": headline(figures["results"]), "table": table.strip().splitlines(), **figures}


def headline(results: list[dict[str, Any]]) -> str:
    """The kit's defaults against torchvision's loop at each batch size and precision, with each one's
    waits a step (host waits / CUDA synchronisations)."""
    by = {(r["batch"], r["variant"]): r for r in results}
    parts = []
    for batch in sorted({b for b, _ in by}):
        for kit, tv in (("kit_amp_bf16", "tv_amp_bf16"), ("kit_amp_fp16", "tv_amp_fp16")):
            ours, theirs = by.get((batch, kit)), by.get((batch, tv))
            if ours and theirs and ours["images_per_s"] and theirs["images_per_s"]:
                parts.append(
                    f"b{batch} {kit} {ours['images_per_s'] / theirs['images_per_s']:.2f}x {tv} "
                    f"(waits {ours['waits']}/{ours['cuda_syncs']} vs {theirs['waits']}/{theirs['cuda_syncs']})"
                )
    return ", ".join(parts)
