"""Draw a run's loss and AP curves from its metrics.jsonl into one PNG, the best checkpoint marked."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..run_dir import METRICS_FILE, output_file_problem


def pyplot() -> Any:
    """matplotlib.pyplot on the file-only backend (no display in pods or CI); imported only when drawing."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, out_png: Path) -> Path:
    """Write `fig` to `out_png` (folders created) and release it."""
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=100)
    pyplot().close(fig)
    return out_png


# What each kind of record must carry for the curves (finite numbers); eval records are drawn by the AP
# keys they have, and those must be numbers when present.
REQUIRED_KEYS = {"train": ("step", "loss"), "val": ("step", "loss"), "eval": ("step",), "best": ("step", "value")}
AP_KEYS = (("bbox_AP", "bbox AP"), ("segm_AP", "segm AP"), ("bbox_AP50", "bbox AP50"))


def metrics_path(given: Path) -> Path:
    """What --metrics names: a metrics file, or a run's output folder, which holds its METRICS_FILE."""
    given = Path(given)
    if not given.is_dir():
        return given
    if not (given / METRICS_FILE).is_file():
        raise UserError(
            f"report --metrics {given}: this folder holds no {METRICS_FILE} (train writes OUTPUT_DIR/{METRICS_FILE}); "
            "give a run's --output-dir or its metrics file"
        )
    return given / METRICS_FILE


def read_report_records(metrics_file: Path) -> list[dict[str, Any]]:
    """The records of a metrics file, each checked for what the report draws; a UserError names the file
    and line of the first record that does not fit. A torn last line (a writer killed mid-line) is skipped."""
    path = Path(metrics_file)
    if not path.is_file():
        raise UserError(f"report: {path} does not exist (train writes OUTPUT_DIR/metrics.jsonl)")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise UserError(f"report: {path} is not a text file ({exc.reason} at byte {exc.start})") from exc
    records = []
    for number, line in enumerate(lines, start=1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):
                continue
            raise UserError(f"report: {path} line {number}: not JSON") from None
        if not isinstance(record, dict):
            raise UserError(f"report: {path} line {number}: a JSON {type(record).__name__}, not a metrics record")
        kind = record.get("kind")
        if kind is not None and not isinstance(kind, str):  # records of other kinds (or none) are not drawn
            raise UserError(f"report: {path} line {number}: 'kind' must be a string such as \"train\", got {kind!r}")
        drawn = [(key, True) for key in REQUIRED_KEYS.get(kind, ())]
        if kind == "eval":
            drawn += [(key, False) for key, _ in AP_KEYS]
        gaps = record.get("non_finite") or {}  # metrics.py writes a NaN or infinite value as null
        for key, required in drawn:
            value = record.get(key)
            if value is None and key in gaps:
                continue
            if (required or value is not None) and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise UserError(f"report: {path} line {number}: a {kind!r} record without a numeric {key!r}")
        records.append(record)
    return records


def _finite(records: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """The records whose `key` can be drawn: a diverged validation loss (nan, inf) leaves a gap."""
    return [r for r in records if r.get(key) is not None and math.isfinite(r[key])]


def draw_report(metrics_file: Path, out_png: Path) -> Path:
    """Training and validation loss (left), COCO bbox/segm AP (right). Returns the PNG's path."""
    records = read_report_records(metrics_file)
    if problem := output_file_problem(out_png, "--out", (".png",)):
        raise UserError(problem)
    plt = pyplot()
    if not any(r.get("kind") == "train" for r in records):
        raise UserError(f"report: {metrics_file} holds no training records")
    train = _finite([r for r in records if r.get("kind") == "train"], "loss")
    val = _finite([r for r in records if r.get("kind") == "val"], "loss")
    evals = [r for r in records if r.get("kind") == "eval"]
    bests = _finite([r for r in records if r.get("kind") == "best"], "value")

    fig, (ax_loss, ax_ap) = plt.subplots(1, 2, figsize=(12, 4.5), sharex=True)  # one step axis for both
    ax_loss.plot([r["step"] for r in train], [r["loss"] for r in train], label="train loss", lw=1)
    if val:
        ax_loss.plot([r["step"] for r in val], [r["loss"] for r in val], "o-", label="validation loss")
    # A log axis cannot show a loss <= 0 (matplotlib warns on stderr and drops the point).
    positive = all(r["loss"] > 0 for r in train + val)
    ax_loss.set(xlabel="step", ylabel="loss (sum of terms)", title="Loss", yscale="log" if positive else "linear")
    ax_loss.legend()
    for key, label in AP_KEYS:
        points = [(r["step"], r[key]) for r in _finite(evals, key)]
        if points:
            ax_ap.plot(*zip(*points), "o-", label=label)
            step, value = points[-1]
            ax_ap.annotate(f"{value:.3f}", (step, value), textcoords="offset points", xytext=(-30, 6))
    if bests:  # the last new best is the run's best: the checkpoint best.pt holds
        best = bests[-1]
        label = f"best {best.get('metric', 'AP')} {best['value']:.3f} (step {best['step']}, best.pt)"
        ax_ap.plot([best["step"]], [best["value"]], "*", color="gold", markeredgecolor="black", ms=16, label=label)
    ax_ap.set(xlabel="step", ylabel="COCO AP", title="Evaluation", ylim=(0, 1))
    if ax_ap.get_lines():  # a run without evaluation: no legend (matplotlib would warn on stderr)
        ax_ap.legend()
    fig.tight_layout()
    return save_figure(fig, out_png)
