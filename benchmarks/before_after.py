"""One benchmark, two versions of the kit, in one run: is a change faster or slower?

    python benchmarks/before_after.py --before ../old-checkout/src --after src --rounds 3 \\
        -- benchmarks/bench_step.py --model maskrcnn_resnet18_fpn --min-size 128 --max-size 128 --no-breakdown

    python benchmarks/before_after.py --before ce77e5b --scale 20000     # the scale check (below)

The benchmark script (this checkout's) runs once per version and round, in a fresh process with that
version's `src` (and the launcher beside it) first on PYTHONPATH, and `{src}` in its arguments replaced
by that folder; the rounds alternate which version runs first, so a shared machine's drift falls on both
alike. `--before` (and `--after`) take a src folder or a git commit, checked out for the run in a
temporary worktree. Each run writes its JSON report (`--json-out`, which the script must take); from
each report the figures are read as rows (`--rows`, a list of objects) keyed by `--key`, each row's
`--value` (one or several, comma-separated) a number or a list of numbers. Printed: for every key and
figure, the median each version gave over all rounds, and after / before.

`--scale N` is the check to run before a change to data/, the data plan or the loader
(docs/performance-data.md): bench_scale.py at N images on the local engine, its first step, resumed step
and data's memory as ratios to one json.load of the annotation file measured in the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import common

HERE = Path(__file__).resolve().parents[1]
SCALE_FIGURES = "first_ratio,resumed_ratio,share_ratio"


def figures(report: dict[str, Any], rows: str, key: str, values: list[str]) -> dict[str, list[float]]:
    """`key / value` -> the numbers of each value in each row of `report[rows]`."""
    found: dict[str, list[float]] = {}
    for row in report[rows]:
        for value in values:
            if value not in row:
                continue
            numbers = row[value] if isinstance(row[value], list) else [row[value]]
            found.setdefault(f"{row[key]} / {value}", []).extend(float(n) for n in numbers)
    return found


def run_version(src: Path, script: list[str], json_out: Path) -> dict[str, Any]:
    paths = [str(src.resolve()), str((src.parent / "launcher").resolve())]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    argv = [a.replace("{src}", str(src.resolve())) for a in script]
    subprocess.run([sys.executable, *argv, "--json-out", str(json_out)], env=env, check=True, stdout=subprocess.DEVNULL)
    return json.loads(json_out.read_text())


@contextlib.contextmanager
def source_folder(given: str, tmp: Path, name: str) -> Iterator[Path]:
    """`given` as a src folder: itself, or a git commit of this repository checked out (detached) in a
    worktree under `tmp` for as long as the run lasts."""
    if Path(given).is_dir():
        yield Path(given)
        return
    tree = tmp / name
    git = ["git", "-C", str(HERE)]
    subprocess.run([*git, "worktree", "add", "--detach", "--quiet", str(tree), given], check=True)
    try:
        yield tree / "src"
    finally:
        subprocess.run([*git, "worktree", "remove", "--force", str(tree)], check=False)


def scale_script(images: int, work: Path) -> list[str]:
    """bench_scale.py at `images` images: the local engine's first and resumed step, each version
    measured with its own code (`{src}`), the set written once in `work`."""
    bench = str(HERE / "benchmarks" / "bench_scale.py")
    return [
        bench,
        "--images",
        str(images),
        "--engines",
        "local",
        "--phases",
        "train",
        "--code",
        "{src}",
        "--work",
        str(work),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the src folder, or a commit, of the version to compare with")
    parser.add_argument("--after", default=str(HERE / "src"), help="the changed version's (default: this checkout's)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", default="results", help="the report's list of rows")
    parser.add_argument("--key", default="variant", help="what names a row")
    parser.add_argument("--value", default="round_s", help="a row's figures, comma-separated (numbers or lists)")
    parser.add_argument("--scale", type=int, metavar="IMAGES", help="the scale check at this many images (above)")
    parser.add_argument("script", nargs=argparse.REMAINDER, help="-- the benchmark script and its arguments")
    args = parser.parse_args()
    script = [a for a in args.script if a != "--"]
    if args.scale is None and not script:
        parser.error("name the benchmark script after --, or --scale IMAGES")
    values = (SCALE_FIGURES if args.scale is not None else args.value).split(",")
    rows, key = ("rows", "engine") if args.scale is not None else (args.rows, args.key)
    collected: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        versions = {name: stack.enter_context(source_folder(given, Path(tmp), name))
                    for name, given in (("before", args.before), ("after", args.after))}  # fmt: skip
        if args.scale is not None:
            script = scale_script(args.scale, Path(tmp) / "scale")
        for round_index in range(args.rounds):
            order = list(versions) if round_index % 2 == 0 else list(reversed(versions))
            for name in order:
                report = run_version(versions[name], script, Path(tmp) / f"{name}-{round_index}.json")
                for label, numbers in figures(report, rows, key, values).items():
                    collected[name].setdefault(label, []).extend(numbers)
                print(f"round {round_index + 1}: {name} done", file=sys.stderr, flush=True)
    table = []
    for label in collected["before"]:
        if label not in collected["after"]:
            continue
        before, after = statistics.median(collected["before"][label]), statistics.median(collected["after"][label])
        table.append([label, f"{before:.4g}", f"{after:.4g}", f"{after / before:.3f}"])
    print(json.dumps(collected, indent=2))
    print(common.render_markdown([key, "before", "after", "after / before"], table))


if __name__ == "__main__":
    main()
