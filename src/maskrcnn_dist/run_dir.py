"""The files a run writes under its --output-dir: their names, in one place.

Torch-free on purpose: the container harness (e2e/) and tools that only read a run's results import
this module without pulling in the trainer.
"""

from __future__ import annotations

import re
from pathlib import Path

METRICS_FILE = "metrics.jsonl"  # metrics.py: one JSON record per line
REPORT_FILE = "report.png"  # report.py
CHECKPOINT_DIR = "checkpoints"  # checkpoint.py: checkpoint_<step>.pt, newest K kept

#: A complete checkpoint's file name; group 1 is the step.
CHECKPOINT_NAME = re.compile(r"^checkpoint_(\d{8})\.pt$")
#: The temporary file of a checkpoint being written (`.checkpoint_<step>.pt.tmp-<pid>`), renamed when complete.
CHECKPOINT_TMP_NAME = re.compile(r"^\.checkpoint_\d{8}\.pt\.tmp-\d+$")
CHECKPOINT_TMP_GLOB = ".checkpoint_*.pt.tmp-*"


def checkpoint_name(step: int) -> str:
    return f"checkpoint_{step:08d}.pt"


def checkpoint_tmp_name(step: int, pid: int) -> str:
    return f".{checkpoint_name(step)}.tmp-{pid}"


def checkpoint_dir(output_dir: Path) -> Path:
    return Path(output_dir) / CHECKPOINT_DIR
