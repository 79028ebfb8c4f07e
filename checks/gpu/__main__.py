"""`python -m checks.gpu`: what `make gpu-check` runs. Prepares the synthetic data, runs the checks of
catalog.py within the time budget, prints the table and writes the JSON report.

    python -m checks.gpu [--device cuda|cpu] [--json-out FILE] [--time-budget 480] [--only a,b]

With `--device cpu` it is a quick self-test of the same checks (ResNet-18 FPN, tiny images) that the test
suite runs (tests/checks/test_gpu_check.py), so the check cannot rot between GPU sessions.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from .catalog import checks_for
from .harness import Env, host_facts, render, run_all, run_child
from .runs import make_data

DEFAULT_JSON = Path("runs/gpu-check/gpu_check.json")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m checks.gpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto", help="auto: cuda when visible")
    parser.add_argument("--json-out", type=Path, default=DEFAULT_JSON, help=f"the JSON report (default {DEFAULT_JSON})")
    parser.add_argument("--time-budget", type=float, default=480.0, help="seconds for all checks together")
    parser.add_argument(
        "--budget-scale", type=float, default=1.0, help="multiply each check's own budget (a slow or busy machine)"
    )
    parser.add_argument("--only", default=None, help="comma separated check names (default: all)")
    parser.add_argument("--work-dir", type=Path, default=None, help="keep data, runs and logs here")
    parser.add_argument(
        "--inject-failure", action="store_true", help="self-test: add a check that raises and one that hangs"
    )
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--plan", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.time_budget <= 0:
        parser.error("--time-budget: seconds, more than 0")
    if args.budget_scale <= 0:
        parser.error("--budget-scale: a factor, more than 0")
    if args.work_dir is not None and args.work_dir.exists() and not args.work_dir.is_dir():
        parser.error(f"--work-dir {args.work_dir}: not a folder")
    if args.work_dir is not None and args.work_dir.is_dir() and any(args.work_dir.iterdir()):
        # An earlier run's checkpoints there would be resumed, and its data would clash with this run's.
        parser.error(f"--work-dir {args.work_dir}: not empty (an earlier run's?); give a new or an empty folder")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so run_group's cleanup ends the process tree it started: the
    # runner's check, and a check's own torchrun or launcher (its own session, out of the runner's reach).
    # Put back at the end: called as a library (the CPU self-test, in a pytest worker), the handler would
    # outlive the run and turn a later SIGTERM to a fork of that process into a SystemExit in a copy of it.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        return _run(args)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(args: argparse.Namespace) -> int:
    if args.child:
        env = Env(**json.loads(args.plan.read_text()))
        return run_child({c.name: c for c in checks_for(env)}[args.child], env)
    import torch

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        print("gpu-check: --device cuda: no CUDA device is visible to this process", file=sys.stderr)
        return 2
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        work = (args.work_dir or Path(tmp)).resolve()
        work.mkdir(parents=True, exist_ok=True)
        gpus = torch.cuda.device_count() if device == "cuda" else 0
        throughput_s = min(120.0, args.time_budget / 3)
        env = Env(device, gpus, str(work), args.inject_failure, throughput_s, budget_scale=args.budget_scale)
        checks = checks_for(env)
        if args.only:
            wanted = args.only.split(",")
            if unknown := sorted(set(wanted) - {c.name for c in checks}):
                print(f"gpu-check: --only: unknown {', '.join(unknown)}", file=sys.stderr)
                return 2
            checks = [c for c in checks if c.name in wanted]
        make_data(env)
        results = run_all(checks, env, args.time_budget - (time.monotonic() - started))
    report = {
        "device": device,
        "host": host_facts(device),
        "profile": asdict(env.profile),
        "seconds": round(time.monotonic() - started, 1),
        "checks": [asdict(r) for r in results],
    }
    print(render(results))
    throughput = next((r for r in results if r.name == "throughput" and r.figures.get("table")), None)
    if throughput is not None:
        print("\n" + "\n".join(throughput.figures["table"]))
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"gpu-check: {sum(r.result == 'fail' for r in results)} failed; report in {args.json_out}")
    return 1 if any(r.result == "fail" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
