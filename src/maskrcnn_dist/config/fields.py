"""The field machinery: how a setting is declared once and everything else derived from it.

`option(...)` declares a dataclass field with its default, flag name (the CLI's `--flag` and the YAML
key), help text and allowed values. `field_specs` turns a settings dataclass into `FieldSpec`s: the
one type converter the CLI and YAML files share (`FieldSpec.parse`) and the check that names the flag
(`FieldSpec.problem`). The tables themselves are sections.py's, train_config.py's and tool_options.py's.
"""

from __future__ import annotations

import dataclasses
import math
import os
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["INT64_MAX", "Bounds", "FieldSpec", "field_specs", "option"]


def option(
    default: Any,
    help: str,
    *,
    flag: str | None = None,
    choices: tuple[str, ...] | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
    above: float | None = None,
    below: float | None = None,
    check: Callable[[Any], str | None] | None = None,
    engines: tuple[str, ...] | None = None,
) -> Any:
    """A config field with its CLI/YAML description. `flag` defaults to the field name with dashes.
    Numbers (and each integer of a list) are bounded by `minimum`/`maximum` (inclusive) and `above`/`below`
    (exclusive); non-finite floats and integers beyond 64 bits are always refused. `check`: what else is
    wrong with a parsed value (the words after the flag), or None: run wherever the value is parsed.
    `engines`: the only --engine values that read the setting (None: every one); given to another, it is
    refused (build.py)."""
    bounds = Bounds(minimum, maximum, above, below)
    meta = {"help": help, "flag": flag, "choices": choices, "bounds": bounds, "check": check, "engines": engines}
    return field(default=default, metadata=meta)


INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class Bounds:
    """The allowed range of a number: inclusive `minimum`/`maximum`, exclusive `above`/`below`."""

    minimum: float | None = None
    maximum: float | None = None
    above: float | None = None
    below: float | None = None

    def problem(self, value: float) -> str | None:
        """What is out of range, e.g. "must be >= 1", or None."""
        if not -(2**63) <= value <= INT64_MAX and isinstance(value, int):
            return "must fit in a signed 64-bit integer"
        for limit, ok, text in (
            (self.minimum, lambda v, lim: v >= lim, ">="),
            (self.maximum, lambda v, lim: v <= lim, "<="),
            (self.above, lambda v, lim: v > lim, ">"),
            (self.below, lambda v, lim: v < lim, "<"),
        ):
            if limit is not None and not ok(value, limit):
                return f"must be {text} {_number(limit)}"
        return None

    def describe(self) -> str:
        """The range for help texts, e.g. ">= 1, <= 64"; empty when unbounded."""
        limits = ((">=", self.minimum), (">", self.above), ("<=", self.maximum), ("<", self.below))
        return ", ".join(f"{text} {_number(limit)}" for text, limit in limits if limit is not None)


def _number(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


@dataclass(frozen=True)
class FieldSpec:
    """One setting: where it lives (`section` of TrainConfig, None for the top level), its flag and type."""

    section: str | None
    name: str
    flag: str
    help: str
    kind: type  # bool, int, float, str, Path, or tuple (of ints)
    optional: bool  # None is a valid value
    default: Any
    choices: tuple[str, ...] | None
    bounds: Bounds
    check: Callable[[Any], str | None] | None = None
    engines: tuple[str, ...] | None = None  # the engines that read it (None: all)

    def get(self, cfg: Any) -> Any:
        return getattr(self._owner(cfg), self.name)

    def set(self, cfg: Any, value: Any) -> None:
        setattr(self._owner(cfg), self.name, value)

    def _owner(self, cfg: Any) -> Any:
        return cfg if self.section is None else getattr(cfg, self.section)

    def parse(self, value: Any) -> Any:
        """A YAML or command-line value as this field's type; ValueError says what was expected."""
        if value is None:
            if self.optional:
                return None
            raise ValueError(f"a value is required (expected {self.type_name})")
        if self.kind is bool:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(f"{value!r} is not a boolean (true/false)")
            return text in ("true", "1", "yes")
        if self.kind is tuple:
            items = value if isinstance(value, (list, tuple)) else str(value).split(",")
            return tuple(_to_int(item) for item in items if str(item).strip() != "")
        if self.kind is Path:
            return _to_path(value)
        if self.kind is int:
            return _to_int(value)
        if self.kind is float:
            if isinstance(value, bool):
                raise ValueError(f"{value!r} is not a number")
            try:
                return float(value)
            except (TypeError, ValueError):
                raise ValueError(f"{value!r} is not a number") from None
        if isinstance(value, bool):  # from YAML: a bare off, on, no, yes is read as a boolean
            raise ValueError(
                f"YAML read a bare word as the boolean {str(value).lower()} (off, on, no and yes are booleans "
                'there): quote it, e.g. "off"'
            )
        return str(value)

    def problem(self, value: Any) -> str | None:
        """What is wrong with an already parsed value, naming the flag; None when it is fine."""
        if value is None:
            return None
        if self.choices is not None and value not in self.choices:
            return f"--{self.flag} must be one of {', '.join(self.choices)}, got {value!r}"
        if self.kind is float and not math.isfinite(value):
            return f"--{self.flag} must be a finite number, got {value}"
        numbers = value if self.kind is tuple else (value,) if self.kind in (int, float) else ()
        for number in numbers:
            if (out_of_range := self.bounds.problem(number)) is not None:
                return f"--{self.flag} {out_of_range}, got {number}"
        if self.check is not None and (wrong := self.check(value)) is not None:
            return f"--{self.flag} {wrong}"
        return None

    @property
    def type_name(self) -> str:
        return {tuple: "comma-separated integers", Path: "a path"}.get(self.kind, self.kind.__name__)


def _to_path(value: Any) -> Path:
    if isinstance(value, (str, os.PathLike)) and str(value).strip():
        return Path(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return Path(str(value))  # YAML reads a folder named 2024 as a number
    # A YAML list or mapping, true/false, or an empty string: Path() would fail later, or mean the
    # current folder.
    raise ValueError(f"{value!r} is not a path")


def _to_int(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not an integer")
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError(f"{value!r} is not an integer")
        return int(value)
    try:
        return int(str(value).strip())
    except ValueError:
        raise ValueError(f"{value!r} is not an integer") from None


def _kind(hint: Any) -> tuple[type, bool]:
    """(base type, optional) of an annotation such as `int | None`, `Path`, `tuple[int, ...]`."""
    args = typing.get_args(hint)
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        base = [a for a in args if a is not type(None)]
        return _kind(base[0])[0], True
    if typing.get_origin(hint) is tuple:
        return tuple, False
    return hint, False


def field_specs(cls: type, section: str | None = None) -> Iterator[FieldSpec]:
    """The fields of a settings dataclass, those of its nested dataclasses under their `section`."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            yield from field_specs(hints[f.name], f.name)
            continue
        kind, optional = _kind(hints[f.name])
        meta = f.metadata
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        yield FieldSpec(
            section=section,
            name=f.name,
            flag=meta.get("flag") or f.name.replace("_", "-"),
            help=meta["help"],
            kind=kind,
            optional=optional,
            default=default,
            choices=meta.get("choices"),
            bounds=meta.get("bounds", Bounds()),
            check=meta.get("check"),
            engines=meta.get("engines"),
        )
