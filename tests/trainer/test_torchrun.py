"""maskrcnn_dist.torchrun: torchrun whose exit status keeps a worker's user error (2), so a JobSet's
podFailurePolicy can fail a ddp job at once instead of restarting it over the same mistake."""

from __future__ import annotations

import sys

import pytest

from maskrcnn_dist.torchrun import pod_exit_status

from .procs import run_job, torchrun_command

# A worker that exits with the code given for its rank (RANK is set by torchrun); the others wait, so
# torchrun has to stop them (they then fail with a signal, not with the user's code).
WORKER = (
    "import os, sys, time; code = {codes}.get(os.environ['RANK']); "
    "time.sleep(0 if code is not None else 60); sys.exit(code or 0)"
)


def _torchrun(codes: dict[str, int], port: int) -> list[str]:
    return torchrun_command(2, port, "--no-python", sys.executable, "-c", WORKER.format(codes=codes))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("codes", "status"),
    [
        ({"0": 0, "1": 0}, 0),
        ({"1": 2}, 2),  # a user error on a rank other than 0, while rank 0 is still running
        ({"0": 1}, 1),  # a runtime failure stays 1
        ({"0": 3}, 1),  # any other code is a runtime failure too
    ],
    ids=["success", "user-error", "runtime-failure", "other-code"],
)
def test_the_pod_exits_with_the_workers_user_error(codes: dict[str, int], status: int, free_port: int) -> None:
    result = run_job(_torchrun(codes, free_port), timeout=120)
    assert result.returncode == status, result.stdout[-3000:]
    if status:
        assert "ChildFailedError" not in result.stdout  # torchrun's page-long report is replaced by one line
        assert f"exit {status}" in result.stdout.splitlines()[-1]


def test_a_user_error_on_any_rank_decides() -> None:
    assert pod_exit_status([2]) == 2
    assert pod_exit_status([-15, 2]) == 2  # the peer stopped by torchrun after the user error
    assert pod_exit_status([1, -15]) == 1
    assert pod_exit_status([3]) == 1


def test_the_exit_barrier_s_early_end_is_one_line_that_says_which() -> None:
    """torch logs an early end of its agents' exit barrier as an error with a traceback: a planned end's."""
    import logging

    import torch.distributed as dist

    from maskrcnn_dist.torchrun import exit_barrier_line

    def record(exc: BaseException | None, msg: str = "Error waiting on exit barrier. Elapsed: %s seconds"):
        return logging.LogRecord(
            "api", logging.ERROR, "api.py", 1, msg, (10.0,), (type(exc), exc, None) if exc else None
        )

    timeout = exit_barrier_line(record(dist.DistStoreError("wait timeout after 10000ms")))
    gone = exit_barrier_line(record(dist.DistNetworkError("Failed to recv, got 0 bytes")))
    assert timeout is not None and timeout.startswith("not every pod reached the end within 10 s")
    assert gone is not None and gone.startswith("the master's pod ended first")
    assert exit_barrier_line(record(None, "Done waiting for other agents. Elapsed: %s seconds")) is None
