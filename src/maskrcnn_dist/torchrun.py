"""`python -m maskrcnn_dist.torchrun ARGS`: torch's torchrun (same arguments), keeping a user error's exit code.

torchrun exits 1 whenever a worker fails, whatever the worker's own exit status, and prints a page-long
ChildFailedError report. A ddp pod's exit status is what Kubernetes and a JobSet act on: exit 2 (the
user's mistake: a bad flag or dataset, already printed as one line by the failing rank) must reach them
as 2, so that the JobSet's podFailurePolicy fails the job at once instead of restarting the group over
the same mistake until maxRestarts. The launcher execs this module for every ddp pod.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import parse_args, run

# The trainer's exit code for a user error (cli.py); any other worker failure is exit 1.
USER_ERROR = 2


def pod_exit_status(worker_exit_codes: Iterable[int]) -> int:
    """The pod's exit status from its failed workers': a user error on any rank is the user's error (the
    other ranks then fail only because a peer left), else a runtime failure."""
    return USER_ERROR if USER_ERROR in set(worker_exit_codes) else 1


def main(argv: Sequence[str] | None = None) -> int:
    try:
        run(parse_args(list(sys.argv[1:] if argv is None else argv)))
    except ChildFailedError as exc:
        rank, first = exc.get_first_failure()
        status = pod_exit_status(failure.exitcode for failure in exc.failures.values())
        print(
            f"maskrcnn-dist torchrun: {len(exc.failures)} worker(s) failed, first rank {rank} with exit code "
            f"{first.exitcode} (its error line is above); exit {status}",
            file=sys.stderr,
        )
        return status
    return 0


if __name__ == "__main__":
    sys.exit(main())
