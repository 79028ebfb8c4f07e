"""`pipeline_amp`: the pipeline's stages under --amp, fp16 and bf16, against the local engine's same run.

Each dtype trains twice from the same seed with the same flags: the local engine, and the pipeline on
the one GPU with device maps (three processes). fp16 scales the loss on the last stage and unscales on
every stage with one scale the master keeps; a stage that skipped its unscale would step 2^16 times too
far, and a skip that one stage missed would leave its weights non-finite. So:
- the loss curves agree within the amp tolerance (`AMP_CURVE_TOLERANCE`, what amp may stray from fp32:
  far looser than two runs of one precision need, far tighter than any of those faults);
- fp16 skips as many steps as the local engine (the same scale from 2^16, the same overflows), takes at
  least one (else nothing was compared: more steps), and both checkpoints end at the same scale;
- every final weight is finite, and the largest difference from the local run's is reported.
On CPU (the self-test) bf16 only: fp16 is refused on a CPU stage.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from .harness import CheckFailed, Env
from .pipeline import launch, train_records
from .runs import base_flags, final_checkpoint, max_abs_diff, train_local_run, train_losses

#: fp16 from GradScaler's 2^16 skips its first steps from random weights (7 of 10 on an H200, run 1).
FP16_STEPS = 12


def dtypes(env: Env) -> tuple[str, ...]:
    return ("float16", "bfloat16") if env.device == "cuda" else ("bfloat16",)


def one_dtype(env: Env, dtype: str) -> dict[str, Any]:
    from maskrcnn_dist.modeling.perf import AMP_CURVE_TOLERANCE

    steps = FP16_STEPS if dtype == "float16" else env.profile.run_steps
    amp = {"amp": True, "amp_dtype": dtype, "max_steps": steps}
    # On CPU with the stage workers' one thread (noise_floor's reason): the same kernels, the same sums.
    threads = {"threads": 1} if env.device == "cpu" else {}
    local = train_local_run(base_flags(env, env.data, Path(env.work) / f"local-amp-{dtype}", **amp, **threads))
    transport = "device_maps" if env.device == "cuda" else "cpu"
    pipe, _ = launch(env, f"pipeline_amp_{dtype}", transport, flags=amp)
    got, expected = train_losses(pipe / "metrics.jsonl"), train_losses(local / "metrics.jsonl")
    if sorted(got) != sorted(expected) or not got:
        raise AssertionError(f"{dtype}: steps differ: pipeline {sorted(got)}, local {sorted(expected)}")
    order = sorted(expected)
    skipped = [sum(1 for r in train_records(run) if r.get("skipped")) for run in (pipe, local)]
    saved = final_checkpoint(pipe), final_checkpoint(local)
    figures: dict[str, Any] = {
        "steps": len(order),
        "loss_first_last": [round(got[order[0]], 4), round(got[order[-1]], 4)],
        "local_loss_first_last": [round(expected[order[0]], 4), round(expected[order[-1]], 4)],
        "max_rel_loss_diff": round(max(abs(got[s] - expected[s]) / abs(expected[s]) for s in order), 6),
        "weights_max_abs_diff": float(f"{max_abs_diff(saved[0]['model'], saved[1]['model']):.3g}"),
        "skipped": {"pipeline": skipped[0], "local": skipped[1]},
        "scale": {"pipeline": saved[0]["scaler"].get("scale"), "local": saved[1]["scaler"].get("scale")},
    }
    problems = AMP_CURVE_TOLERANCE.problems([got[s] for s in order], [expected[s] for s in order])
    if not all(math.isfinite(float(v.float().abs().max())) for v in saved[0]["model"].values() if v.numel()):
        problems.append("a final weight is not finite")
    if dtype == "float16":
        if skipped[0] != skipped[1] or figures["scale"]["pipeline"] != figures["scale"]["local"]:
            problems.append(f"the loss scale went its own way: skipped {skipped}, scale {figures['scale']}")
        if skipped[0] >= len(order):
            problems.append(f"every one of the {len(order)} fp16 steps overflowed: no step was compared")
    if problems:
        raise CheckFailed(f"{dtype} stages against the local engine: {'; '.join(problems)}", figures)
    return figures


def check_amp_stages(env: Env) -> dict[str, Any]:
    figures = {dtype: one_dtype(env, dtype) for dtype in dtypes(env)}
    figures["headline"] = "; ".join(
        f"{dtype}: loss within {f['max_rel_loss_diff']:.2g} of local, {f['skipped']['pipeline']} skipped"
        for dtype, f in figures.items()
    )
    return figures
