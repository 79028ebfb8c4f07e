"""The throughput part of the check: benchmarks/bench_gpu_step.py (a benchmark, run as one) within its
share of the run's budget; its table and figures become the check's."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from .harness import Env
from .runs import run_logged

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_gpu_step.py"


def check_throughput(env: Env) -> dict[str, Any]:
    """images/s and step memory of the kit's local engine under each setting and of torchvision's loop
    under the same settings; a profile of two steps (CUDA). Fails only when the benchmark does."""
    out = Path(env.work) / "throughput"
    report = out / "bench_gpu_step.json"
    # The batch sizes left when the budget is spent are skipped by the benchmark itself, so a slow
    # device still reports the first ones; the rest of the budget is the margin for one batch size.
    command = [sys.executable, str(SCRIPT), "--device", env.device, "--json-out", str(report)]
    command += ["--time-budget", str(env.throughput_budget_s * 0.5)]
    log = run_logged(command, out / "bench.log", env.throughput_budget_s * env.budget_scale, threads=2)
    table = log[: log.index("{\n")] if "{\n" in log else log
    (out / "table.md").write_text(table)
    figures = json.loads(report.read_text())
    return {"headline": headline(figures["results"]), "table": table.strip().splitlines(), **figures}


def headline(results: list[dict[str, Any]]) -> str:
    """The kit's defaults against torchvision's loop at each batch size, fp32 and amp (fp16 on CUDA)."""
    rate = {(r["batch"], r["variant"]): r["images_per_s"] for r in results}
    parts = []
    for batch in sorted({b for b, _ in rate}):
        for kit, tv in (("kit_fp32", "tv_fp32"), ("kit_amp_fp16", "tv_amp_fp16"), ("kit_amp_bf16", "tv_amp_bf16")):
            if rate.get((batch, kit)) and rate.get((batch, tv)):
                parts.append(f"b{batch} {kit} {rate[batch, kit] / rate[batch, tv]:.2f}x {tv}")
    return ", ".join(parts)
