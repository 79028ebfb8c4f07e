"""Errors the launcher reports to the user: each carries every problem found, one line each."""

from __future__ import annotations


class LauncherError(Exception):
    """Bad input or an unreachable peer. The CLI prints `errors` one per line and exits 2."""

    def __init__(self, errors: list[str] | str) -> None:
        self.errors = [errors] if isinstance(errors, str) else list(errors)
        super().__init__("; ".join(self.errors))


class TopologyError(LauncherError):
    """The topology YAML is invalid (all problems collected, each naming its field)."""


class IdentityError(LauncherError):
    """This pod's identity cannot be derived (flags, environment, pod name)."""


class PeerTimeout(LauncherError):
    """A peer (the master's DNS name or TCP port) was not reachable within the bound."""


class PlanFormatError(LauncherError):
    """A `MASKRCNN_POD_PLAN` record does not parse (missing, not JSON, wrong fields)."""
