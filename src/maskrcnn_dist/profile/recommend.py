"""Rank the predictions, print the table, say which to choose and why, and what the figures rest on."""

from __future__ import annotations

from collections.abc import Sequence

from .cost_model import Prediction, Setting
from .measure import Measurements

_GIB = 1024**3


def rank(predictions: Sequence[Prediction]) -> list[Prediction]:
    """Candidates that fit first, then by predicted images/s, fastest first."""
    return sorted(predictions, key=lambda p: (not p.fits, -p.images_per_s))


def recommended(ranked: Sequence[Prediction]) -> Prediction | None:
    """The fastest candidate that fits in memory; None when none does (never one that does not fit)."""
    return next((p for p in ranked if p.fits), None)


def table(ranked: Sequence[Prediction]) -> list[str]:
    # images/step: ddp's --batch-size is per process, so its steps hold more images than a pipeline's.
    header = ("#", "engine", "split", "replicas", "img/step", "step s", "images/s", "link s", "mem/device", "fits")
    rows = [
        (
            str(i),
            p.candidate.engine,
            p.candidate.split,
            ",".join(map(str, p.candidate.replicas)) if p.candidate.engine == "pipeline" else f"{p.candidate.devices}x",
            str(p.images_per_step),
            f"{p.step_s:.3f}",
            f"{p.images_per_s:.2f}",
            f"{p.link_s:.3f}",
            f"{p.memory_bytes / _GIB:.2f} GiB",
            "yes" if p.fits else "NO",
        )
        for i, p in enumerate(ranked, start=1)
    ]
    widths = [max(len(r[c]) for r in [header, *rows]) for c in range(len(header))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in [header, *rows]]


def why(best: Prediction | None, ranked: Sequence[Prediction]) -> str:
    """One line: which to choose, and the figure that decides it."""
    if best is None:
        need = min(p.memory_bytes for p in ranked) / _GIB
        return f"choose none: no candidate fits in a device's memory (the smallest needs {need:.2f} GiB per device)"
    others = [p for p in ranked if p.fits and p is not best]
    line = f"choose {best.candidate.engine} ({best.candidate.split}"
    if best.candidate.engine == "pipeline":
        line += f", replicas {','.join(map(str, best.candidate.replicas))}"
    line += f") because it predicts {best.images_per_s:.2f} images/s"
    if best.candidate.engine == "ddp":
        # --batch-size is per process under ddp: say so, the global batch (and the lr it wants) differs.
        line += f" ({best.candidate.devices} processes x --batch-size: {best.images_per_step} images per step)"
    if others:
        runner = others[0]
        ratio = best.images_per_s / runner.images_per_s
        line += f", {ratio:.2f}x the next ({runner.candidate.engine}: {runner.candidate.split})"
    if best.candidate.engine == "pipeline" and best.stage_s:
        slowest = max(range(len(best.stage_s)), key=best.stage_s.__getitem__)
        line += (
            f"; its slowest stage ({'+'.join(best.candidate.stages[slowest])}) takes {best.stage_s[slowest]:.3f} s "
            "per micro-batch (after replicas)"
        )
    share = best.link_s / best.step_s if best.step_s else 0.0
    line += f"; the network is {share:.0%} of its step"
    skipped = sum(1 for p in ranked if not p.fits)
    if skipped:
        line += f"; {skipped} candidate(s) left out: they do not fit in memory"
    return line


def limits(meas: Measurements, setting: Setting) -> list[str]:
    """What the figures rest on, in plain words."""
    shared = (
        f"all processes on this one host, {setting.shared_cores} cores shared (compute slowed by busy threads / cores)"
        if setting.shared_cores
        else "each pod on its own machine of this type"
    )
    return [
        f"measured on this device type only ({meas.device}, {meas.threads} thread(s)); other devices need their "
        "own profile",
        f"the network is modelled, not measured: {setting.link_gbps:g} Gbit/s per link, no overlap with compute, "
        "no latency",
        (
            f"data assumed: {meas.instances_per_image} instances per image, images of {meas.image_size[0]}x"
            f"{meas.image_size[1]} px (synthetic); RoI-head time grows with instances"
            if meas.data == "synthetic"
            else f"data: {meas.data}; other data (more instances, larger images) costs differently"
        ),
        f"placement assumed: {shared}; pipeline stages as GPipe (all forwards, then all backwards), a stage's "
        "replicas taking micro-batches in turn; ddp runs --batch-size per process (processes x batch per step)",
        f"memory per device: parameters + gradients + SGD momentum + activations of every in-flight micro-batch, "
        f"against {setting.device_memory_bytes / _GIB:.2f} GiB",
        "splits with a stage of only `transform` are not offered: a stage trains parameters, and it has none "
        "(the launcher refuses such a topology)",
    ]
