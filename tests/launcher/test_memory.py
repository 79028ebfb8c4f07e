"""`plan` warns about a pod whose ranks (each with its DataLoader workers, by a measured figure) and
/dev/shm would exceed its memory limit (maskrcnn_launcher/memory.py)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from maskrcnn_launcher.cli import main
from maskrcnn_launcher.errors import LauncherError
from maskrcnn_launcher.memory import MemoryBudget, memory_warnings, quantity_bytes
from maskrcnn_launcher.plan import derive_job
from maskrcnn_launcher.topology import parse_topology


def ddp(devices: int) -> object:
    topology = parse_topology({"engine": "ddp", "master": {"devices": devices}, "workers": [{"devices": 1}]}, "t.yaml")
    return derive_job(topology, "master.example", 29500)


def test_a_pod_of_eight_ranks_is_warned_about_only_past_its_limit() -> None:
    job = ddp(8)
    gib = 2**30
    fits = MemoryBudget(pod_limit=16 * gib, shm=2 * gib, per_rank=int(1.5 * gib))  # 8 x 1.5 + 2 = 14
    assert memory_warnings(job, fits) == []
    over = MemoryBudget(pod_limit=16 * gib, shm=2 * gib, per_rank=int(1.9 * gib))  # 8 x 1.9 + 2 = 17.2
    (line,) = memory_warnings(job, over)  # the master's 8 ranks; the worker's 1 fits
    assert line.startswith("master 0: 8 rank(s) x 1.90 GiB + 2.00 GiB /dev/shm = 17.2 GiB")
    assert "16.0 GiB" in line


def test_plan_prints_the_warning_on_stderr() -> None:
    runner = CliRunner()
    quiet = runner.invoke(main, ["plan", "--topology", "ddp"])
    assert quiet.exit_code == 0 and "warning" not in quiet.stderr
    warned = runner.invoke(main, ["plan", "--topology", "ddp", "--rank-memory", "4Gi", "--pod-memory", "16Gi"])
    assert warned.exit_code == 0
    assert warned.stderr.count("warning: ") == 3  # every pod of the packaged ddp topology has 4 ranks
    assert "4 rank(s) x 4.00 GiB" in warned.stderr


@pytest.mark.parametrize("text,expected", [("16Gi", 16 * 2**30), ("1.5Gi", int(1.5 * 2**30)), ("500M", 500 * 10**6)])
def test_quantities(text: str, expected: int) -> None:
    assert quantity_bytes(text, "--x") == expected


def test_a_bad_quantity_is_named() -> None:
    with pytest.raises(LauncherError, match="--pod-memory '16GB': not a memory quantity"):
        quantity_bytes("16GB", "--pod-memory")
