"""The demo's AP with the batched heads against torchvision's heads, beside the noise of the seed.

    .venv/bin/python benchmarks/bench_heads_ap.py [--seeds 3] [--steps 120] [--size 128] [--short] [--json-out FILE]

Each run is the demo's job (config.demo_flags: synthetic COCO, R18-FPN 128 px, batch 4, CPU) on the
local engine with one thread, `--steps` steps (the demo's 120 by default) at `--size` px (images and
model; the demo's 128 by default; `--short`: a warm-up of 10 steps and no validation loss, for a
short run on a loaded machine), evaluated once at the end (bbox and segm AP on the val
split), with `--heads torchvision` or `--heads batched` and `--seed` 0..N-1; the two forms alternate,
seed by seed, so drift of a shared machine falls on both. The seed moves the initial weights, the data
order and every random draw: the spread of torchvision's form over seeds is the noise the batched form
is judged against. The batched form is within the noise when the difference of the two means is under
twice its standard error (each form's sample standard deviation over its seeds).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (a sibling script's module, not a package)

from maskrcnn_dist.config import demo_flags, to_argv  # noqa: E402

FORMS = ("torchvision", "batched")
METRICS = ("bbox_AP", "segm_AP")


def train_once(out: Path, heads: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """One demo training run in its own process; its final evaluation's AP and its wall seconds."""
    flags = demo_flags(out, args.steps, "local") | {"heads": heads, "seed": seed, "threads": 1, "workers": 0}
    flags |= {"min-size": args.size, "max-size": args.size, "synthetic-image-size": args.size}
    if args.short:  # a shorter warm-up and no validation loss: the AP of a short run, sooner
        flags |= {"warmup-iters": min(10, args.steps), "val-period": 0}
    command = [sys.executable, "-m", "maskrcnn_dist.cli", "train", *to_argv(flags)]
    started = time.monotonic()
    common.run_group(command, dict(os.environ), out.parent / f"{out.name}.log", args.timeout)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    final = [r for r in records if r["kind"] == "eval"][-1]
    return {
        "heads": heads,
        "seed": seed,
        **{m: final[m] for m in METRICS},
        "seconds": round(time.monotonic() - started),
    }


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per metric: each form's mean and standard deviation over seeds, the difference of the means and
    whether it is within twice its standard error."""
    out: dict[str, Any] = {}
    for metric in METRICS:
        values = {form: [r[metric] for r in runs if r["heads"] == form] for form in FORMS}
        means = {form: statistics.fmean(v) for form, v in values.items()}
        sds = {form: statistics.stdev(v) if len(v) > 1 else float("nan") for form, v in values.items()}
        error = math.sqrt(sum(sds[f] ** 2 / len(values[f]) for f in FORMS))
        difference = means["batched"] - means["torchvision"]
        out[metric] = {
            "mean": {f: round(m, 4) for f, m in means.items()},
            "sd": {f: round(s, 4) for f, s in sds.items()},
            "difference": round(difference, 4),
            "standard_error": round(error, 4),
            "within_noise": abs(difference) <= 2 * error,
        }
    return out


def render(runs: list[dict[str, Any]], result: dict[str, Any], load: list[float]) -> str:
    header = ["heads", "seed", *METRICS, "s"]
    body = [[r["heads"], r["seed"], r["bbox_AP"], r["segm_AP"], r["seconds"]] for r in runs]
    lines = [f"load average {load}", common.render_markdown(header, body), ""]
    for metric, s in result.items():
        lines.append(
            f"{metric}: torchvision {s['mean']['torchvision']} (sd {s['sd']['torchvision']}), batched "
            f"{s['mean']['batched']} (sd {s['sd']['batched']}); difference {s['difference']} vs 2 x "
            f"{s['standard_error']}: {'within' if s['within_noise'] else 'OUTSIDE'} the noise"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--size", type=int, default=128, help="image and model size in px (the demo's: 128)")
    parser.add_argument("--short", action="store_true", help="warm-up of 10 steps, no validation loss")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per run")
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.seeds < 2:
        parser.error("--seeds: at least 2 (the noise is a standard deviation over seeds)")
    runs = []
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench_heads_ap_") as tmp:
        for seed in range(args.seeds):
            forms = FORMS if seed % 2 == 0 else tuple(reversed(FORMS))
            for heads in forms:
                runs.append(train_once(Path(tmp) / f"{heads}-{seed}", heads, seed, args))
                print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    load = [round((a + b) / 2, 2) for a, b in zip(load_before, os.getloadavg())]
    result = summary(runs)
    report = {
        "steps": args.steps,
        "size": args.size,
        "short": args.short,
        "load": load,
        "runs": runs,
        "summary": result,
    }
    common.emit(render(runs, result, load), report, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
