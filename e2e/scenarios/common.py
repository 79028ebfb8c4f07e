"""What every scenario shares: the release's names, the bounds the trainer runs under, the harness's
settings and results, and the small CPU run the pods train.

Pods: release `e2e` in namespace `e2e`, so the master is
`e2e-maskrcnn-dist-master-0.e2e-maskrcnn-dist-headless.e2e.svc.cluster.local`, or as a JobSet pod
`e2e-maskrcnn-dist-master-0-0.e2e-maskrcnn-dist-headless.e2e.svc.cluster.local` (the `jobset*` scenarios,
whose controller is emulated by cluster/jobset.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from maskrcnn_dist.config import small_cpu_run, to_argv

RELEASE = "e2e"
NAMESPACE = "e2e"
RUN_DIR = f"/data/runs/{RELEASE}"  # the chart's --output-dir, /data/runs/{{ .Release.Name }}
# --rpc-timeout, "seconds before a silent peer counts as lost": the trainer's default of 120 s where no
# scenario waits for it (a killed or restarted peer's connection closes, which is noticed at once), so
# that a step slowed by a loaded machine, or by the scenario running beside this one, is never taken
# for a lost peer; 30 s in silent-peer, which waits it out (a frozen peer closes nothing).
LIVENESS_TIMEOUT = 120
RPC_TIMEOUT = 30
EXIT_MARGIN = 15  # process teardown on top of it (interpreter exit, torchrun's agent)
WAIT_TIMEOUT = 240  # MASKRCNN_WAIT_TIMEOUT: how long a worker waits for the master


@dataclass
class Settings:
    helm: str
    image: str
    out: Path  # runs/e2e
    kubelet_backoff: float = 10.0  # the kubelet's first crash-loop back-off
    session: str = ""  # the harness run's id: the start of every run id, so of every container and network name


@dataclass
class Result:
    name: str
    ok: bool
    seconds: float
    detail: str = ""
    facts: dict[str, Any] = field(default_factory=dict)


def trainer_args(
    steps: int,
    checkpoint_period: int,
    synthetic: bool = True,
    keep: int = 50,
    epochs: int = 20,
    extra: tuple[str, ...] = (),
    rpc_timeout: int = LIVENESS_TIMEOUT,
) -> list[str]:
    """The small CPU run (config.small_cpu_run): R18-FPN at 64-96 px, 8 synthetic images, batch 2, one
    thread per process."""
    flags = small_cpu_run(
        96,
        min_size=64,
        data_path="/data/synthetic",
        **({"synthetic_images": 8, "synthetic_image_size": 96} if synthetic else {}),
        batch_size=2,
        workers=0,
        threads=1,
        flush_denormal=True,
        epochs=epochs,
        max_steps=steps,
        eval_every_epoch=False,
        checkpoint_period=checkpoint_period,
        keep_checkpoints=keep,
        rpc_timeout=rpc_timeout,
        print_freq=1,
    )
    return [*to_argv(flags), *extra, "--output-dir", "/data/runs/{{ .Release.Name }}", "--resume", "auto"]


def expected_checkpoints(steps: int, period: int, iters_per_epoch: int) -> list[int]:
    """Periodic checkpoints, one at every epoch end, and the last step."""
    return sorted({*range(period, steps + 1, period), *range(iters_per_epoch, steps + 1, iters_per_epoch), steps})
