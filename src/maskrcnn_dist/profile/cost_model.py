"""The cost model: predicted step time, images/s and memory per device of a candidate, from the
measured module costs.

Pipeline (GPipe): a stage runs its modules' forward + backward once per micro-batch; the stage host
deals micro-batch k to replica k % R, so each of R replicas runs ceil(M / R) of the M micro-batches
and the stage's time per micro-batch slot is that busy time / M (R = 2 with M = 1 gains nothing).
The step is (M + S - 1) x the slowest stage's slot time (fill and drain: the bubble), plus the
slowest stage's optimizer step, plus the link time of every cut (the master's input link included):
M micro-batches x (activation bytes forward + gradient bytes back) / bandwidth.
ddp: `--batch-size B` is per process, so each of N processes runs B images through the whole model
(time scaled linearly from the measured micro-batch), N x B images per step, steps its optimizer,
and all-reduces the gradients: 2(N-1)/N x gradient bytes / bandwidth (ring all-reduce).

Shared cores: when every process runs on this one host (`maskrcnn-launch local`), busy processes
x threads each (plus any other runnable work, `background_load`) can exceed the cores; compute then
slows by that ratio (time-slicing), not more. The profile's CPU timings are CPU time, free of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .candidates import Candidate
from .measure import Measurements

#: SGD with momentum: the weights, their gradients and one momentum buffer per trainable weight.
OPTIMIZER_COPIES = 2


@dataclass(frozen=True)
class Setting:
    """What the model needs besides the measurements."""

    batch: int  # --batch-size: the pipeline's whole batch; ddp's batch per process
    micro_batches: int
    link_gbps: float
    device_memory_bytes: int  # capacity of one device (a GPU, or a process's share of host RAM)
    shared_cores: int | None = None  # all processes on one host with this many cores; None: own hosts
    background_load: float = 0.0  # other runnable threads on that host (e.g. measured procs_running)

    @property
    def link_bytes_per_s(self) -> float:
        return self.link_gbps * 1e9 / 8


@dataclass(frozen=True)
class Prediction:
    candidate: Candidate
    compute_s: float  # bubble-inclusive compute (pipeline) or per-process forward+backward (ddp)
    link_s: float  # activations and gradients over the network, or the all-reduce
    step_s: float
    images_per_step: int  # pipeline: the batch; ddp: processes x the batch
    images_per_s: float
    memory_bytes: int  # on the most loaded device
    fits: bool
    stage_s: tuple[float, ...] = ()  # pipeline: per stage, its busiest replica's time / M (one slot)


def _contention(setting: Setting, busy_processes: int, threads: int) -> float:
    if setting.shared_cores is None:
        return 1.0
    return max(1.0, (busy_processes * threads + setting.background_load) / setting.shared_cores)


def micro_batches_per_replica(micro_batches: int, replicas: int) -> int:
    """How many of a step's micro-batches the busiest replica of a stage runs (round-robin dealing)."""
    return math.ceil(micro_batches / replicas)


def predict(meas: Measurements, cand: Candidate, setting: Setting) -> Prediction:
    return _predict_ddp(meas, cand, setting) if cand.engine == "ddp" else _predict_pipeline(meas, cand, setting)


def _predict_pipeline(meas: Measurements, cand: Candidate, setting: Setting) -> Prediction:
    micro = min(setting.micro_batches, setting.batch)
    # Measured on micro-batches of meas.micro_batch_images; this setting's may differ.
    scale = (setting.batch / micro) / meas.micro_batch_images
    busy = sum(cand.replicas)  # replicas are threads of one process, each a busy compute stream
    slow = _contention(setting, busy, meas.threads)
    stage_s, opt_s, memory = [], [], []
    for names, replicas in zip(cand.stages, cand.replicas, strict=True):
        mods = [meas.module(n) for n in names]
        waves = micro_batches_per_replica(micro, replicas)
        stage_s.append(slow * scale * sum(m.forward_s + m.backward_s for m in mods) * waves / micro)
        opt_s.append(slow * sum(m.optimizer_s for m in mods))
        params = sum(m.param_bytes + OPTIMIZER_COPIES * m.trainable_bytes for m in mods)
        # Every micro-batch's activations stay until its backward (GPipe): the busiest replica's device
        # holds those of all the micro-batches dealt to it, and a whole copy of the stage's weights.
        activations = scale * waves * sum(m.activation_bytes for m in mods)
        memory.append(int(params + activations))
    compute = (micro + len(stage_s) - 1) * max(stage_s) + max(opt_s)
    cut_after = ["input"] + [names[-1] for names in cand.stages[:-1]]
    moved = sum(meas.cut_after(c).forward_bytes + meas.cut_after(c).backward_bytes for c in cut_after)
    link = micro * scale * moved / setting.link_bytes_per_s
    return _prediction(cand, setting.batch, compute, link, max(memory), setting, tuple(stage_s))


def _predict_ddp(meas: Measurements, cand: Candidate, setting: Setting) -> Prediction:
    n = cand.devices
    scale = setting.batch / meas.micro_batch_images  # the flag is per process: each runs the whole batch
    slow = _contention(setting, n, meas.threads)
    mods = meas.modules
    compute = slow * (scale * sum(m.forward_s + m.backward_s for m in mods) + sum(m.optimizer_s for m in mods))
    grads = sum(m.trainable_bytes for m in mods)
    link = 2 * (n - 1) / n * grads / setting.link_bytes_per_s
    params = sum(m.param_bytes + OPTIMIZER_COPIES * m.trainable_bytes for m in mods)
    activations = scale * sum(m.activation_bytes for m in mods)
    return _prediction(cand, n * setting.batch, compute, link, int(params + activations), setting)


def _prediction(
    cand: Candidate,
    images: int,
    compute: float,
    link: float,
    memory: int,
    setting: Setting,
    stage_s: tuple[float, ...] = (),
) -> Prediction:
    step = compute + link
    return Prediction(
        candidate=cand,
        compute_s=compute,
        link_s=link,
        step_s=step,
        images_per_step=images,
        images_per_s=images / step,
        memory_bytes=memory,
        fits=memory <= setting.device_memory_bytes,
        stage_s=stage_s,
    )
