"""The cost model: predicted step time, images/s and memory per device of a candidate, from the
measured module costs.

Pipeline (GPipe): a stage's micro-batch time is the sum of its modules' forward + backward on its
device divided by its replicas; the step is (M + S - 1) x the slowest stage's micro-batch time (the
bubble), plus the slowest stage's optimizer step, plus the link time of every cut (the master's
input link included): M micro-batches x (activation bytes forward + gradient bytes back) / bandwidth.
ddp: each of N processes runs batch/N images through the whole model (time scaled linearly from the
measured micro-batch), steps its optimizer, and all-reduces the gradients: 2(N-1)/N x gradient bytes
/ bandwidth (ring all-reduce).

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

    batch: int  # images per optimizer step (the whole batch)
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
    images_per_s: float
    memory_bytes: int  # on the most loaded device
    fits: bool
    stage_s: tuple[float, ...] = ()  # pipeline: micro-batch time per stage (after replicas)


def _contention(setting: Setting, busy_processes: int, threads: int) -> float:
    if setting.shared_cores is None:
        return 1.0
    return max(1.0, (busy_processes * threads + setting.background_load) / setting.shared_cores)


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
        stage_s.append(slow * scale * sum(m.forward_s + m.backward_s for m in mods) / replicas)
        opt_s.append(slow * sum(m.optimizer_s for m in mods))
        params = sum(m.param_bytes + OPTIMIZER_COPIES * m.trainable_bytes for m in mods)
        # Every micro-batch's activations stay until its backward (GPipe), spread over the replicas.
        activations = scale * micro * sum(m.activation_bytes for m in mods) / replicas
        memory.append(int(params + activations))
    compute = (micro + len(stage_s) - 1) * max(stage_s) + max(opt_s)
    cut_after = ["input"] + [names[-1] for names in cand.stages[:-1]]
    moved = sum(meas.cut_after(c).forward_bytes + meas.cut_after(c).backward_bytes for c in cut_after)
    link = micro * scale * moved / setting.link_bytes_per_s
    return _prediction(cand, setting, compute, link, max(memory), tuple(stage_s))


def _predict_ddp(meas: Measurements, cand: Candidate, setting: Setting) -> Prediction:
    n = cand.devices
    per_process = setting.batch / n
    scale = per_process / meas.micro_batch_images
    slow = _contention(setting, n, meas.threads)
    mods = meas.modules
    compute = slow * (scale * sum(m.forward_s + m.backward_s for m in mods) + sum(m.optimizer_s for m in mods))
    grads = sum(m.trainable_bytes for m in mods)
    link = 2 * (n - 1) / n * grads / setting.link_bytes_per_s
    params = sum(m.param_bytes + OPTIMIZER_COPIES * m.trainable_bytes for m in mods)
    activations = math.ceil(per_process) / meas.micro_batch_images * sum(m.activation_bytes for m in mods)
    return _prediction(cand, setting, compute, link, int(params + activations))


def _prediction(
    cand: Candidate, setting: Setting, compute: float, link: float, memory: int, stage_s: tuple[float, ...] = ()
) -> Prediction:
    step = compute + link
    return Prediction(
        candidate=cand,
        compute_s=compute,
        link_s=link,
        step_s=step,
        images_per_s=setting.batch / step,
        memory_bytes=memory,
        fits=memory <= setting.device_memory_bytes,
        stage_s=stage_s,
    )
