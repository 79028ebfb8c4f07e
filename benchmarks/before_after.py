"""One benchmark, two versions of the kit, in one run: is a change faster or slower?

    python benchmarks/before_after.py --before ../old-checkout/src --after src --rounds 3 \\
        -- benchmarks/bench_step.py --model maskrcnn_resnet18_fpn --min-size 128 --max-size 128 --no-breakdown

The benchmark script (this checkout's) runs once per version and round, in a fresh process with that
version's `src` (and the launcher beside it) first on PYTHONPATH; the rounds alternate which version runs
first, so a shared machine's drift falls on both alike. Each run writes its JSON report (`--json-out`, which
the script must take); from each report the figures are read as rows (`--rows`, a list of objects) keyed by
`--key`, each row's `--value` a number or a list of numbers (several values: comma separated, one table
each). Printed: for every key, the median of every figure each version gave over all rounds, and after /
before.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import common


def figures(report: dict[str, Any], rows: str, key: str, value: str) -> dict[str, list[float]]:
    """`key` -> the numbers of `value` in each row of `report[rows]` that has it."""
    found: dict[str, list[float]] = {}
    for row in report[rows]:
        if value not in row:
            continue
        numbers = row[value] if isinstance(row[value], list) else [row[value]]
        found.setdefault(str(row[key]), []).extend(float(n) for n in numbers)
    return found


def run_version(src: Path, script: list[str], json_out: Path) -> dict[str, Any]:
    paths = [str(src.resolve()), str((src.parent / "launcher").resolve())]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    subprocess.run(
        [sys.executable, *script, "--json-out", str(json_out)], env=env, check=True, stdout=subprocess.DEVNULL
    )
    return json.loads(json_out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="the src folder of the version to compare with")
    parser.add_argument("--after", type=Path, required=True, help="the src folder of the changed version")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", default="results", help="the report's list of rows")
    parser.add_argument("--key", default="variant", help="what names a row")
    parser.add_argument("--value", default="round_s", help="a row's figure (a number or a list of them); a,b: several")
    parser.add_argument("script", nargs=argparse.REMAINDER, help="-- the benchmark script and its arguments")
    args = parser.parse_args()
    script = [a for a in args.script if a != "--"]
    if not script:
        parser.error("name the benchmark script after --")
    versions = {"before": args.before, "after": args.after}
    values = args.value.split(",")
    collected = {value: {name: {} for name in versions} for value in values}
    with tempfile.TemporaryDirectory() as tmp:
        for round_index in range(args.rounds):
            order = list(versions) if round_index % 2 == 0 else list(reversed(versions))
            for name in order:
                report = run_version(versions[name], script, Path(tmp) / f"{name}-{round_index}.json")
                for value in values:
                    for key, numbers in figures(report, args.rows, args.key, value).items():
                        collected[value][name].setdefault(key, []).extend(numbers)
                print(f"round {round_index + 1}: {name} done", file=sys.stderr, flush=True)
    print(json.dumps(collected, indent=2))
    for value in values:
        rows = []
        for key, before_numbers in collected[value]["before"].items():
            if key not in collected[value]["after"]:
                continue
            before, after = statistics.median(before_numbers), statistics.median(collected[value]["after"][key])
            rows.append([key, f"{before:.4g}", f"{after:.4g}", f"{after / before:.3f}"])
        print(common.render_markdown([args.key, f"before {value}", f"after {value}", "after / before"], rows))


if __name__ == "__main__":
    main()
