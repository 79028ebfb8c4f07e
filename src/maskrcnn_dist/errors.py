"""Errors the user can fix: bad input files, fields or flags."""


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


def one_line(exc: BaseException, limit: int = 300) -> str:
    """An exception's message on one line, shortened: torch's messages can run to a page (and put the
    detail on later lines), and the CLI prints a user error as one line."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
