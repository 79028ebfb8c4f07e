"""Checking a mapping a user wrote (a topology), field by field: every problem is collected, each
naming its field's path (`workers[0].devices`), so the user sees all of them at once, not one per run.

The topology's schema (topology.py) says which fields exist and what they mean; this module only
knows how a field is checked and how a problem is worded.
"""

from __future__ import annotations

import difflib
from typing import Any

from maskrcnn_launcher.errors import LauncherError


class FieldProblems:
    """Collects problems; `raise_if_any` raises them all at once as `error` (a LauncherError)."""

    def __init__(self, error: type[LauncherError]) -> None:
        self.error = error
        self.items: list[str] = []

    def add(self, where: str, message: str) -> None:
        self.items.append(f"{where}: {message}")

    def keys(self, data: dict[str, Any], where: str, known: tuple[str, ...]) -> None:
        for key in data:
            if key not in known:
                path = f"{where}.{key}" if where else str(key)
                self.add(path, f"unknown key{suggest(str(key), known)} (known: {', '.join(known)})")

    def int_field(self, data: dict[str, Any], key: str, where: str, default: int, minimum: int, maximum: int) -> int:
        """An integer in [minimum, maximum]; every count has a ceiling, or a typo such as 2**70 replicas
        would pass here and fail (or hang) in whatever tries to start that many."""
        value = data.get(key, default)
        if not is_int(value):
            self.add(where, f"expected an integer, got {value!r}")
            return default
        if value < minimum:
            self.add(where, f"{value} is below the minimum {minimum}")
            return default
        if value > maximum:
            self.add(where, f"{value} is above the maximum {maximum}")
            return default
        return value

    def raise_if_any(self, source: str) -> None:
        if self.items:
            raise self.error([f"{source}: {item}" for item in self.items])


def is_int(value: Any) -> bool:
    """An int that is not a bool (YAML's `true` is one in Python)."""
    return isinstance(value, int) and not isinstance(value, bool)


def as_mapping(value: Any, where: str, problems: FieldProblems) -> dict[str, Any]:
    """`value` if it is a mapping, {} if absent; anything else is a problem at `where` (and {})."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        problems.add(where, f"expected a mapping, got {type(value).__name__}")
        return {}
    return value


def suggest(word: str, choices: tuple[str, ...] | list[str]) -> str:
    """` 'word'`, with ` (did you mean 'x'?)` when one of `choices` is close."""
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" {word!r} (did you mean {close[0]!r}?)" if close else f" {word!r}"
