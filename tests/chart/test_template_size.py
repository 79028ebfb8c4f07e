"""The chart's templates stay small enough to read: each file under helm/templates/ is at most
MAX_TEMPLATE_LINES lines. A template that grows past it is split by concern into another partial
(`_<concern>.tpl`, its named templates each documented by a comment), as _pod.tpl and _validate.tpl
were. Needs no helm.
"""

from __future__ import annotations

from pathlib import Path

from .conftest import CHART

MAX_TEMPLATE_LINES = 250


def template_sizes(templates: Path) -> dict[str, int]:
    """Path relative to `templates` -> line count, for every file below it (helm test hooks included)."""
    return {
        str(path.relative_to(templates)): len(path.read_text().splitlines())
        for path in sorted(templates.rglob("*"))
        if path.is_file()
    }


def test_every_template_is_at_most_max_template_lines_long() -> None:
    sizes = template_sizes(CHART / "templates")
    assert "_pod.tpl" in sizes, f"no chart templates found under {CHART / 'templates'}"
    too_long = {name: lines for name, lines in sizes.items() if lines > MAX_TEMPLATE_LINES}
    assert not too_long, (
        f"helm/templates files over {MAX_TEMPLATE_LINES} lines: "
        + ", ".join(f"{name} ({lines})" for name, lines in too_long.items())
        + ". Split each by concern into another partial (helm/templates/_<concern>.tpl, every named"
        " template documented by a comment) rather than raising the bound; check that the rendered"
        " output stays byte-identical."
    )
