"""Whether each pod's processes fit its memory limit, from a measured figure per rank.

A ddp pod runs one trainer per GPU, each with its DataLoader workers; the chart's /dev/shm (an emptyDir
in memory) counts against the same limit. The figure per rank is what one trainer and its workers take
together (their PSS: pages shared between them, such as the dataset mapped from its cache, counted
once), measured at the dataset's scale by benchmarks/bench_scale.py or read off a running job; the
default is that benchmark's figure at COCO 2017 train's scale (docs/performance.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from maskrcnn_launcher.errors import LauncherError
from maskrcnn_launcher.plan import JobPlan

_UNITS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_QUANTITY = re.compile(r"^(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?$")
GiB = 2**30
# benchmarks/bench_scale.py at 118,287 images, ddp with 2 DataLoader workers per rank: the largest rank's
# PSS with its workers, rounded up (docs/performance.md). A GPU rank adds its CUDA libraries' host memory.
DEFAULT_RANK_MEMORY = "1.5Gi"


def quantity_bytes(text: str, flag: str) -> int:
    """A Kubernetes memory quantity (`16Gi`, `1.5Gi`, `500M`, `1073741824`) in bytes."""
    found = _QUANTITY.match(text.strip())
    if not found:
        raise LauncherError(f"{flag} {text!r}: not a memory quantity such as 16Gi, 1.5Gi or 500M")
    return int(float(found.group(1)) * _UNITS[found.group(2) or ""])


@dataclass(frozen=True)
class MemoryBudget:
    """A pod's memory limit, its /dev/shm size, and what one rank (trainer + its workers) takes."""

    pod_limit: int
    shm: int
    per_rank: int


def memory_warnings(job: JobPlan, budget: MemoryBudget) -> list[str]:
    """One line per pod whose ranks and /dev/shm would exceed its limit (none when all fit)."""
    lines = []
    for launch in job.launches:
        ranks = launch.nproc_per_node
        need = ranks * budget.per_rank + budget.shm
        if need > budget.pod_limit:
            lines.append(
                f"{launch.plan.role} {launch.plan.index}: {ranks} rank(s) x {budget.per_rank / GiB:.2f} GiB "
                f"+ {budget.shm / GiB:.2f} GiB /dev/shm = {need / GiB:.1f} GiB, over the pod's memory limit of "
                f"{budget.pod_limit / GiB:.1f} GiB: raise the limit (master/worker.resources.limits.memory) "
                "or run fewer ranks per pod"
            )
    return lines
