"""Errors the user can fix (bad input files, fields or flags) and how every trainer failure leaves the
process: `classify` is the trainer's part of the error boundary (maskrcnn_launcher.boundary, through the
contract), which prints one `error:` line and exits 2 for the user's mistakes, 1 for the rest."""

from __future__ import annotations

import re

from maskrcnn_launcher.contract import EXIT_RUNTIME, EXIT_USER_ERROR, Failure
from maskrcnn_launcher.contract import one_line as _one_line


class UserError(Exception):
    """Bad input from the user (file, field or flag). The CLI prints str(e) as one line and exits 2."""


class DatasetError(UserError): ...


class ConfigError(UserError): ...


class CheckpointError(UserError): ...


class WeightsError(UserError):
    """A pretrained weights file is missing or does not fit the model."""


class TrainingError(Exception):
    """Training cannot go on (e.g. a non-finite loss). Printed as one line; the exit code is 1."""


class PeerLostError(TrainingError):
    """A distributed peer stopped answering: the job exits so the group can restart and resume."""


class ParityError(Exception):
    """An exported model whose detections differ from the eager model's beyond the tolerances (or that
    does not run): printed as one line naming the worst image; the exit code is 1."""


def one_line(exc: BaseException, limit: int = 300) -> str:
    """An exception's message on one line, shortened: torch's messages can run to a page (and put the
    detail on later lines), and the CLI prints a user error as one line."""
    return _one_line(str(exc), limit) or type(exc).__name__


# torch re-raises an exception from a DataLoader worker as the same type, its message replaced by
# "Caught X in DataLoader worker process N.\nOriginal Traceback ...\n<module>.X: <message>".
_WORKER_WRAPPED = re.compile(r"^Caught \w+ in DataLoader worker process \d+\.")
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*: ")
# torch.distributed's errors of a wait that ran out (named, not imported: this module loads without torch).
_PEER_WAITS = ("DistNetworkError", "DistStoreError", "DistBackendError", "DistError")


def original_message(exc: BaseException) -> str:
    """`exc`'s own message, without the worker traceback torch wraps around it."""
    text = str(exc)
    if not _WORKER_WRAPPED.match(text):
        return text
    lines = text.splitlines()
    last = max((i for i, line in enumerate(lines) if _EXCEPTION_LINE.match(line)), default=None)
    if last is None:
        return lines[-1] if lines else text
    return " ".join([_EXCEPTION_LINE.sub("", lines[last]), *lines[last + 1 :]])


def classify(exc: BaseException) -> Failure | None:
    """The trainer's exceptions for the error boundary; None leaves the rest to it."""
    if isinstance(exc, UserError):
        return Failure.own(EXIT_USER_ERROR, original_message(exc))
    if isinstance(exc, (TrainingError, ParityError)):
        return Failure.of(EXIT_RUNTIME, original_message(exc))
    if type(exc).__name__ == "OutOfMemoryError":  # torch.OutOfMemoryError (CUDA), without importing torch here
        return Failure.of(EXIT_RUNTIME, "out of GPU memory: lower --batch-size or the image size, or use --amp")
    if type(exc).__name__ in _PEER_WAITS and any(word in str(exc).lower() for word in ("timed out", "timeout")):
        # torch.distributed's DistNetworkError / DistStoreError: a wait for a peer or the store ran out.
        return Failure.of(
            EXIT_RUNTIME,
            f"{type(exc).__name__}: {original_message(exc).rstrip('.')}; every wait for a peer is bounded by "
            "--rpc-timeout (seconds): raise it if the peers need longer to start or to answer, else one is gone",
        )
    if _WORKER_WRAPPED.match(str(exc)):
        return Failure.of(EXIT_RUNTIME, f"in a DataLoader worker: {type(exc).__name__}: {original_message(exc)}")
    return None
