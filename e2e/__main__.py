"""`python -m e2e run|list|clean`: the container end-to-end tests (what `make e2e` runs).

    python -m e2e run --image maskrcnn-dist:0.1.0 --helm .tools/helm [--only pipeline,ddp] [--skip ...]
    python -m e2e list
    python -m e2e clean        # remove containers/networks left by a harness that was itself killed

Exit status: 0 every selected scenario passed, 1 one failed, 2 bad usage or no docker.
A summary (name, pass/fail, seconds, facts) is printed and written to runs/e2e/summary.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import signal
import sys
import time
import traceback
from pathlib import Path

from maskrcnn_launcher.contract import signal_handlers

from .checks import Failed
from .cluster import DockerError, SpecError, clean_all, daemon_answers, image_exists
from .scenarios import DDP_ONLY, ROOT, SCENARIOS, Result, Settings

log = logging.getLogger("e2e")


class Terminated(BaseException):
    """SIGTERM (from `timeout` or CI): unwinds through every `finally`, so containers are removed."""


def _on_term(signum, frame):  # noqa: ARG001
    raise Terminated(f"signal {signum}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m e2e", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run scenarios")
    run.add_argument("--image", required=True, help="the image `make image` built, e.g. maskrcnn-dist:0.1.0")
    run.add_argument("--helm", default=shutil.which("helm") or str(ROOT / ".tools" / "helm"))
    run.add_argument("--only", default="", help="comma-separated scenario names (default: all)")
    run.add_argument("--skip", default="", help="comma-separated scenario names to leave out")
    run.add_argument("--engines", default="pipeline,ddp", help="'ddp' runs only the ddp scenarios")
    run.add_argument("--out", type=Path, default=ROOT / "runs" / "e2e")
    run.add_argument("--kubelet-backoff", type=float, default=10.0, help="first crash-loop back-off, seconds")
    sub.add_parser("list", help="list the scenarios")
    sub.add_parser("clean", help="remove leftovers of a killed harness (label maskrcnn-e2e)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s e2e: %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("maskrcnn_dist").setLevel(logging.WARNING)  # the checks load checkpoints

    if args.command == "list":
        for name, func in SCENARIOS.items():
            print(f"{name:16} {(func.__doc__ or '').split(chr(10))[0]}")
        return 0
    if args.command == "clean":
        print(f"removed {clean_all()} containers/networks")
        return 0

    if not daemon_answers():
        print("e2e: no docker daemon answers (`docker info` fails); .ci/run starts one", file=sys.stderr)
        return 2
    if not image_exists(args.image):
        print(f"e2e: image {args.image} not found; run `make image` first", file=sys.stderr)
        return 2
    names = _selected(args.only, args.skip, args.engines)
    if names is None:
        return 2
    with signal_handlers({signal.SIGTERM: _on_term}):
        settings = Settings(helm=args.helm, image=args.image, out=args.out, kubelet_backoff=args.kubelet_backoff)
        args.out.mkdir(parents=True, exist_ok=True)
        results = _run_all(names, settings)
        _print_summary(results)
    return 0 if results and all(r.ok for r in results) else 1


def _selected(only: str, skip: str, engines: str) -> list[str] | None:
    """The scenarios to run, in registry order; None (after saying why) when a name is unknown."""
    names = [n for n in (only.split(",") if only else SCENARIOS) if n]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        print(f"e2e: unknown scenarios {unknown}; known: {', '.join(SCENARIOS)}", file=sys.stderr)
        return None
    left_out = set(filter(None, skip.split(",")))
    if "pipeline" not in engines.split(","):
        left_out |= {n for n in names if n not in DDP_ONLY}
    return [n for n in names if n not in left_out]


def _run_all(names: list[str], settings: Settings) -> list[Result]:
    """Run each scenario, go on after a failure, and write runs/e2e/summary.json even when interrupted."""
    results: list[Result] = []
    try:
        for name in names:
            results.append(_run_one(name, settings))
    except (Terminated, KeyboardInterrupt) as exc:
        log.error("interrupted (%s); containers removed", exc)
        results.append(Result("interrupted", False, 0.0, detail=str(exc)))
    finally:
        summary = [vars(r) for r in results]
        (settings.out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return results


def _run_one(name: str, settings: Settings) -> Result:
    log.info("=== %s: %s", name, (SCENARIOS[name].__doc__ or "").split("\n")[0])
    started = time.monotonic()
    try:
        facts = SCENARIOS[name](settings)
        result = Result(name, True, time.monotonic() - started, facts=facts)
        log.info("=== %s: passed in %.0fs %s", name, result.seconds, json.dumps(facts))
    except (Failed, DockerError, SpecError) as exc:
        result = Result(name, False, time.monotonic() - started, detail=str(exc))
        log.error("=== %s: FAILED in %.0fs: %s (logs: %s)", name, result.seconds, exc, settings.out / name)
    except Exception as exc:  # a harness bug: still run the others, still report
        result = Result(name, False, time.monotonic() - started, detail=traceback.format_exc())
        log.error("=== %s: ERROR %s", name, exc)
    return result


def _print_summary(results: list[Result]) -> None:
    print("\ne2e summary:")
    for r in results:
        first = r.detail.splitlines()[0] if r.detail else ""
        print(f"  {'PASS' if r.ok else 'FAIL'}  {r.name:16} {r.seconds:6.0f}s  {first}")


if __name__ == "__main__":
    sys.exit(main())
