"""What the launcher's commands share on their command lines: the parameter types that check a value
where click's would let it through (seconds, DNS names), the `--topology` option, and the launcher's own
progress lines (stderr: stdout is the trainer's, or a command's answer)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any, TypeVar

import click

from maskrcnn_launcher import contract
from maskrcnn_launcher.topology import builtin_topologies

F = TypeVar("F", bound=Callable[..., Any])


class _Seconds(click.ParamType):
    """A finite number of seconds above 0 (click's FloatRange lets nan and inf through)."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not math.isfinite(seconds) or seconds <= 0:
            self.fail(f"{value!r} must be a finite number of seconds > 0", param, ctx)
        return seconds


SECONDS = _Seconds()


class DnsName(click.ParamType):
    """A Kubernetes name that becomes part of a pod's DNS name: a DNS-1123 label (`labels=1`) or a
    subdomain of them (the cluster domain). The plan prints those DNS names; a wrong one would only
    show up as a worker that never finds its master."""

    _LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

    def __init__(self, subdomain: bool = False) -> None:
        self.subdomain = subdomain
        self.name = "dns-subdomain" if subdomain else "dns-label"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value)
        labels = text.split(".") if self.subdomain else [text]
        if len(text) > (253 if self.subdomain else 63) or not all(
            len(label) <= 63 and self._LABEL.match(label) for label in labels
        ):
            what = "dot-separated labels of" if self.subdomain else "at most 63"
            self.fail(
                f"{text!r} is not a DNS name: {what} lower-case letters, digits and '-', starting and ending "
                "with a letter or digit",
                param,
                ctx,
            )
        return text


def topology_option(func: F) -> F:
    return click.option(
        "--topology",
        "topology_ref",
        envvar=contract.TOPOLOGY,
        default=None,
        metavar="FILE|NAME",
        help=f"Topology YAML, or a packaged one by name ({', '.join(builtin_topologies())}); "
        f"default: ${contract.TOPOLOGY}, else three-machines.",
    )(func)


def log(message: str) -> None:
    """The launcher's own progress lines go to stderr: stdout is the trainer's, or a command's answer."""
    click.echo(message, err=True)
