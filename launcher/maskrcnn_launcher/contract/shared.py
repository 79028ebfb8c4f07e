"""What the contract takes from the launcher's own modules, re-exported by the package face: the exit
codes and the error boundary every entry point runs in (boundary.py: Kubernetes acts on a pod's exit
code, so the trainer's processes must exit the way the launcher's do), the error a bad plan raises
(errors.py) and the reader of the YAML files a user writes (yamlfile.py: a key given twice is an error,
so a topology and a trainer `--config` are read alike).

The names are defined where the launcher needs them; this module only says which of them belong to
the contract (`__all__`; ruff keeps the imports and the list in step).
"""

from __future__ import annotations

from maskrcnn_launcher.boundary import (
    DEBUG_ENV,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_RUNTIME,
    EXIT_STOPPED,
    EXIT_TERMINATED,
    EXIT_UNREACHABLE,
    EXIT_USER_ERROR,
    Failure,
    GuardedGroup,
    one_line,
    os_error_line,
)
from maskrcnn_launcher.errors import PlanFormatError
from maskrcnn_launcher.yamlfile import load_yaml

__all__ = [
    "DEBUG_ENV",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_RUNTIME",
    "EXIT_STOPPED",
    "EXIT_TERMINATED",
    "EXIT_UNREACHABLE",
    "EXIT_USER_ERROR",
    "Failure",
    "GuardedGroup",
    "PlanFormatError",
    "load_yaml",
    "one_line",
    "os_error_line",
]
