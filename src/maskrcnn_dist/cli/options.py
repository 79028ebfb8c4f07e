"""The trainer's click options, generated from the config's fields (config.FIELDS): one converter per
field (FieldSpec.parse), so that flags and YAML keys can never drift apart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from .. import config as config_mod


class FieldType(click.ParamType):
    """A config field's one converter (config.FieldSpec.parse), so the CLI and YAML files agree."""

    def __init__(self, spec: config_mod.FieldSpec) -> None:
        self.spec = spec
        self.name = spec.type_name

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            parsed = self.spec.parse(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        # A choice is part of the type, as with click.Choice: commands that build no TrainConfig
        # (check-data, report) never run its validation, and an unknown mode must not reach the library.
        if self.spec.choices is not None and parsed is not None and parsed not in self.spec.choices:
            self.fail(f"{parsed!r} is not one of {', '.join(self.spec.choices)}", param, ctx)
        return parsed


def field_options(specs: tuple[config_mod.FieldSpec, ...]):
    """click options for config fields (default None: "not given", so YAML and saved values can fill in)."""

    def decorate(func):
        for spec in reversed(specs):
            if spec.kind is bool:
                func = click.option(f"--{spec.flag}/--no-{spec.flag}", flag_param(spec), default=None, help=spec.help)(
                    func
                )
            else:
                func = click.option(
                    f"--{spec.flag}", flag_param(spec), type=FieldType(spec), default=None, help=help_of(spec)
                )(func)
        return func

    return decorate


def train_options(func):
    """Every train flag, generated from config.FIELDS so flags and YAML keys can never drift apart."""
    func = field_options(config_mod.FIELDS)(func)
    return click.option(
        "--config",
        "config_file",
        type=click.Path(path_type=Path),
        help="YAML file of flag names -> values (flags given here win)",
    )(func)


def help_of(spec: config_mod.FieldSpec) -> str:
    bounds = spec.bounds.describe()
    return f"{spec.help} [{bounds}]" if bounds else spec.help


def flag_param(spec: config_mod.FieldSpec) -> str:
    return spec.flag.replace("-", "_")


def collect(kwargs: dict[str, Any]) -> dict[str, Any]:
    """click's keyword arguments back to flag names."""
    return {key.replace("_", "-"): value for key, value in kwargs.items()}
