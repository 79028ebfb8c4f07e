"""The runner of the GPU check: each check in its own process tree with a time budget, its result.

A check that raises, crashes the interpreter or runs past its budget ends as "fail" with one line
saying why, and the run goes on to the next. A check that cannot run here ends as "skipped" with the
reason, decided before any process starts. The run's whole budget bounds the sum: a check that would
start with under 5 s left is skipped as "out of time".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import common

RESULTS = ("pass", "fail", "skipped")
MIN_BUDGET_S = 5.0  # a check is not started with less


@dataclass(frozen=True)
class Profile:
    """Model, sizes and step counts of one device kind."""

    model: str
    image_size: int  # short side of the model's resize, and the largest side of the synthetic images
    max_size: int
    batch_size: int
    run_steps: int  # ddp and pipeline runs
    amp_batches: int  # batches the amp check compares on
    train_images: int
    val_images: int
    throughput_rounds: int  # bench_gpu_step.py's timed rounds (3, its default, where the figures mean something)
    threads: int | None  # CPU threads of each process a check runs; None: torch's own choice and 2 for the benchmark
    rois_per_image: int | None = None  # --box-batch-size-per-image of every run; None: the model's own
    detections_per_image: int | None = None  # --detections-per-image of every run; None: the model's own


# The CPU profile is the self-test's: every check's code path, at the fewest steps that take it (one
# optimizer step a run, two amp batches so that the second compares at trained weights, one timed round),
# one thread a process: on a busy machine (make test's two workers) two threads a process wait on each
# other, a step 5x slower than with one. 32 RoIs an image: a CPU without bf16 or fp16 units (AVX2 only)
# runs the heads' half-precision convolutions on im2col's slow path, and an amp step at 128 takes 2x as long.
# Evaluation keeps 10 detections an image, not 100: a barely trained model's detections are low-score boxes
# everywhere, each through the mask head's four 256-channel convolutions, under amp on that slow path.
PROFILES = {
    "cuda": Profile("maskrcnn_resnet50_fpn", 800, 1333, 2, 2, 3, 16, 4, 3, None),
    "cpu": Profile("maskrcnn_resnet18_fpn", 64, 64, 2, 1, 2, 8, 2, 1, 1, rois_per_image=32, detections_per_image=10),
}


@dataclass(frozen=True)
class Env:
    """What every check's process gets from the runner (JSON through --plan)."""

    device: str  # "cuda" or "cpu"
    gpus: int
    work: str
    inject_failure: bool = False
    # Seconds the throughput benchmark may take (its share of the run's budget).
    throughput_budget_s: float = 120.0
    # Each check's own budget is multiplied by this: the CPU self-test on a loaded machine makes the
    # budgets hang guards far beyond the measured times (tests/checks/test_gpu_check.py).
    budget_scale: float = 1.0

    @property
    def profile(self) -> Profile:
        return PROFILES[self.device]

    @property
    def data(self) -> Path:
        return Path(self.work) / "data"  # train split only: no validation or COCO AP inside runs

    @property
    def eval_data(self) -> Path:
        return Path(self.work) / "data-eval"  # train (linked) + val


@dataclass
class CheckResult:
    name: str
    result: str  # one of RESULTS
    seconds: float
    figures: dict[str, Any] = field(default_factory=dict)
    reason: str = ""  # the error line of a failure, or why it was skipped


@dataclass(frozen=True)
class Check:
    name: str
    budget_s: float
    run: Callable[[Env], dict[str, Any]]
    # Why it cannot run here, or None; decided by the runner, without starting a process.
    needs: Callable[[Env], str | None] = lambda env: None
    # Set: the budget is budget_s times the seconds this earlier check took in the same run (a floor
    # measured under the same load), for a check that always runs out its budget (the injected hang).
    budget_per_second_of: str | None = None


class CheckFailed(AssertionError):
    """A check's failure that keeps the figures it measured (the report shows them beside the reason)."""

    def __init__(self, message: str, figures: dict[str, Any]) -> None:
        super().__init__(message)
        self.figures = figures


def needs_cuda(env: Env) -> str | None:
    return None if env.device == "cuda" else "needs CUDA (--device cpu)"


def needs_two_gpus(env: Env) -> str | None:
    return None if env.gpus >= 2 else f"needs 2 GPUs ({env.gpus} here)"


def run_child(check: Check, env: Env) -> int:
    """`--child NAME`: run one check in this process and write its figures, or its error line."""
    out = Path(env.work) / "results" / f"{check.name}.json"
    try:
        import torch

        from maskrcnn_dist.modeling.perf import set_flush_denormal

        # What perf.setup_process does for every run (--flush-denormal is on by default), before any
        # computation: without it the CPU steps of a fresh model are 3-6x slower.
        if env.profile.threads:
            torch.set_num_threads(env.profile.threads)
        set_flush_denormal(True)
        figures = check.run(env)
    except Exception as exc:  # every failure becomes the one line the table shows
        traceback.print_exc()
        out.write_text(json.dumps({"error": one_line(exc), "figures": getattr(exc, "figures", {})}))
        return 1
    out.write_text(json.dumps({"figures": figures}))
    return 0


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:400]


def run_check(check: Check, env: Env, plan: Path, budget_s: float) -> CheckResult:
    """One check in its own process tree, ended after `budget_s`; never raises."""
    reason = check.needs(env)
    if reason:
        return CheckResult(check.name, "skipped", 0.0, reason=reason)
    if budget_s < MIN_BUDGET_S:
        return CheckResult(check.name, "skipped", 0.0, reason="out of time: the run's time budget is spent")
    results = Path(env.work) / "results"
    results.mkdir(parents=True, exist_ok=True)
    out = results / f"{check.name}.json"
    out.unlink(missing_ok=True)
    command = [sys.executable, "-m", "checks.gpu", "--child", check.name, "--plan", str(plan)]
    started = time.monotonic()
    error = ""
    try:
        common.run_group(command, child_environment(), results / f"{check.name}.log", budget_s)
    except subprocess.TimeoutExpired:
        error = f"timed out after its budget of {budget_s:.0f} s"
    except RuntimeError as exc:  # non-zero exit: the child's own error line, else the log's last line
        error = str(exc).strip().splitlines()[-1]
    seconds = round(time.monotonic() - started, 1)
    report = json.loads(out.read_text()) if out.is_file() else {}
    if "error" in report:
        return CheckResult(check.name, "fail", seconds, report.get("figures", {}), reason=report["error"])
    if error or "figures" not in report:
        return CheckResult(check.name, "fail", seconds, reason=error or "no result written")
    return CheckResult(check.name, "pass", seconds, figures=report["figures"])


def child_environment() -> dict[str, str]:
    """This environment, with the repository root importable (`checks`, `benchmarks`) from any folder."""
    root = str(Path(__file__).resolve().parents[2])
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else ""), "PYTHONUNBUFFERED": "1"}


def run_all(checks: Sequence[Check], env: Env, time_budget_s: float) -> list[CheckResult]:
    plan = Path(env.work) / "plan.json"
    plan.write_text(json.dumps(asdict(env)))
    deadline = time.monotonic() + time_budget_s
    results: list[CheckResult] = []
    for check in checks:
        budget = check.budget_s
        if check.budget_per_second_of is not None:
            # Taken as 10 s when that check did not run here (--only).
            floor = next((r.seconds for r in results if r.name == check.budget_per_second_of), 10.0)
            budget = max(MIN_BUDGET_S, round(budget * floor))
        result = run_check(check, env, plan, min(budget, deadline - time.monotonic()))
        print(f"{result.name}: {result.result} ({result.seconds:.1f} s) {result.reason}", file=sys.stderr, flush=True)
        results.append(result)
    return results


def host_facts(device: str) -> dict[str, Any]:
    """What ran the check: the host, Python, torch, and the GPU with its driver, CUDA and cuDNN."""
    import platform

    import torch
    import torchvision

    facts: dict[str, Any] = {
        "cpu": common.cpu_isa()["model"],
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0,
    }
    if facts["gpus"]:
        props = torch.cuda.get_device_properties(0)
        facts |= {
            "gpu": props.name,
            "gpu_memory_mib": props.total_memory // 2**20,
            "compute_capability": f"{props.major}.{props.minor}",
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),
            "driver": nvidia_driver(),
        }
    return facts


def nvidia_driver() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def summary(figures: dict[str, Any]) -> str:
    """Key figures in one cell: a check's own headline, else its scalars and the ends of its lists."""
    if "headline" in figures:
        return str(figures["headline"])
    parts = []
    for key, value in figures.items():
        if isinstance(value, dict):
            inner = ", ".join(f"{v}" for v in value.values() if v is not None and not isinstance(v, (dict, list)))
            parts.append(f"{key} {inner}")
        elif isinstance(value, list):
            parts.append(f"{key} {value[0]}..{value[-1]}" if value and not isinstance(value[0], dict) else key)
        else:
            parts.append(f"{key} {value}")
    return "; ".join(parts)[:300]


def render(results: list[CheckResult]) -> str:
    header = ("check", "result", "key figures", "seconds")
    body = [
        (r.name, r.result, r.reason if r.result != "pass" else summary(r.figures), f"{r.seconds:.1f}") for r in results
    ]
    return common.render_table(header, body)
