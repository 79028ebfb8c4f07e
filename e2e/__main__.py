"""`python -m e2e run|list|clean`: the container end-to-end tests (what `make e2e` runs).

    python -m e2e run --image maskrcnn-dist:0.1.0 --helm .tools/helm [--jobs 2] [--only pipeline,ddp] [--skip ...]
    python -m e2e list
    python -m e2e clean        # remove containers/networks left by a harness that was itself killed

Exit status: 0 every selected scenario passed, 1 one failed, 2 bad usage or no docker.
A summary (name, pass/fail, seconds, facts) is printed and written to runs/e2e/summary.json, in the
registry's order whatever order the scenarios ran in. Each scenario runs in a process and a cluster of
its own, up to --jobs at once, the longest first (MEASURED_SECONDS); SIGTERM or SIGINT stops them all,
each removing its containers.
"""

from __future__ import annotations

import argparse
import json
import logging
import secrets
import shutil
import signal
import sys
from pathlib import Path

from maskrcnn_launcher.contract import signal_handlers

from .cluster import clean_all, daemon_answers, image_exists
from .runner import scenario_launcher
from .scenarios import DDP_ONLY, MEASURED_SECONDS, ROOT, SCENARIOS, Result, Settings
from .schedule import Scheduler, longest_first

log = logging.getLogger("e2e")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m e2e", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run scenarios")
    run.add_argument("--image", required=True, help="the image `make image` built, e.g. maskrcnn-dist:0.1.0")
    run.add_argument("--helm", default=shutil.which("helm") or str(ROOT / ".tools" / "helm"))
    run.add_argument("--only", default="", help="comma-separated scenario names (default: all)")
    run.add_argument("--skip", default="", help="comma-separated scenario names to leave out")
    run.add_argument(
        "--jobs", type=_positive, default=1, help="scenarios at once, the longest first (1: one by one, registry order)"
    )
    run.add_argument("--engines", default="pipeline,ddp", help="'ddp' runs only the ddp scenarios")
    run.add_argument("--out", type=Path, default=ROOT / "runs" / "e2e")
    run.add_argument("--kubelet-backoff", type=float, default=10.0, help="first crash-loop back-off, seconds")
    sub.add_parser("list", help="list the scenarios")
    clean = sub.add_parser("clean", help="remove leftovers of a killed harness (label maskrcnn-e2e)")
    clean.add_argument("--session", default="", help="only those of this run (its log's first line names it)")
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
        print(f"removed {clean_all(args.session)} containers/networks")
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
    session = secrets.token_hex(2)  # in every container and network name of this run: `clean --session`
    settings = Settings(args.helm, args.image, args.out, args.kubelet_backoff, session=session)
    args.out.mkdir(parents=True, exist_ok=True)
    scheduler = Scheduler(scenario_launcher(SCENARIOS, settings), jobs=args.jobs)
    order = longest_first(names, MEASURED_SECONDS) if args.jobs > 1 else names
    log.info("harness: session %s, %d scenarios, %d at a time: %s", session, len(names), args.jobs, ", ".join(order))
    with signal_handlers({signal.SIGTERM: scheduler.stop, signal.SIGINT: scheduler.stop}):
        results = scheduler.run(names, order)
        _write_summary(results, args.out)
    _print_summary(results)
    if scheduler.stopped_by is not None:
        print(f"e2e: stopped by {scheduler.stopped_by}; left behind, if any: python -m e2e clean --session {session}")
    return 0 if results and all(r.ok for r in results) else 1


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: at least 1")
    return value


def _selected(only: str, skip: str, engines: str) -> list[str] | None:
    """The scenarios to run, in registry order; None (after saying why) when a name is unknown."""
    names = [n for n in only.split(",") if n] if only else list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        print(f"e2e: unknown scenarios {unknown}; known: {', '.join(SCENARIOS)}", file=sys.stderr)
        return None
    left_out = set(filter(None, skip.split(",")))
    if "pipeline" not in engines.split(","):
        left_out |= {n for n in names if n not in DDP_ONLY}
    return [n for n in SCENARIOS if n in names and n not in left_out]


def _write_summary(results: list[Result], out: Path) -> None:
    (out / "summary.json").write_text(json.dumps([vars(r) for r in results], indent=1, default=str))


def _print_summary(results: list[Result]) -> None:
    print("\ne2e summary:")
    for r in results:
        first = r.detail.splitlines()[0] if r.detail else ""
        print(f"  {'PASS' if r.ok else 'FAIL'}  {r.name:22} {r.seconds:6.0f}s  {first}")


if __name__ == "__main__":
    sys.exit(main())
