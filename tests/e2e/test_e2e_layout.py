"""The e2e harness's rooms, read from the source with `ast`: sizes, and the fence around the cluster.

- No file under e2e/ over 400 lines, no function there over 60 (decorators, signature and docstring
  count: a function is its lines from `def` or its first decorator to its last statement).
- The emulated cluster (e2e/cluster/) knows nothing of the scenarios, their checks or the trainer,
  and the rest of the harness reaches it only through e2e/cluster/__init__.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

from test_layering import external_imports  # tests/ is on sys.path: tests/conftest.py's folder

ROOT = Path(__file__).resolve().parents[2]
E2E = ROOT / "e2e"
CLUSTER = E2E / "cluster"
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60


def oversize_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> dict[str, int]:
    """`qualified name: lines` of each function (nested and methods too) longer than `limit`."""
    found: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = f"{prefix}{getattr(child, 'name', '')}"
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                if child.end_lineno - first + 1 > limit:
                    found[name] = child.end_lineno - first + 1
            visit(
                child,
                f"{name}." if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else prefix,
            )

    visit(ast.parse(source), "")
    return found


def _e2e_files() -> list[Path]:
    return sorted(p for p in E2E.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def test_no_e2e_file_over_400_lines() -> None:
    lines = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in _e2e_files()}
    assert len(lines) >= 15, f"the harness's files were not found: {sorted(lines)}"
    assert {f: n for f, n in lines.items() if n > MAX_FILE_LINES} == {}


def test_no_e2e_function_over_60_lines() -> None:
    sources = [p for p in _e2e_files() if p.suffix == ".py"]
    oversize = {str(p.relative_to(ROOT)): oversize_functions(p.read_text()) for p in sources}
    assert {f: found for f, found in oversize.items() if found} == {}


def test_the_size_check_catches_an_oversize_function() -> None:
    """The check above would pass on a reader that finds nothing: show it measures what it claims."""

    def function(name: str, body_lines: int, indent: str = "") -> str:
        body = "".join(f"{indent}    x{i} = {i}\n" for i in range(body_lines))
        return f"{indent}def {name}():\n{body}"

    at_limit = function("fits", MAX_FUNCTION_LINES - 1)  # the `def` line + 59 = 60 lines
    method = "class C:\n    @staticmethod\n" + function("too_long", MAX_FUNCTION_LINES - 1, indent="    ")
    nested = "def outer():\n" + function("inner", MAX_FUNCTION_LINES, indent="    ") + "    return inner\n"
    assert oversize_functions(at_limit) == {}
    assert oversize_functions(function("too_long", MAX_FUNCTION_LINES)) == {"too_long": 61}
    assert oversize_functions(method) == {"C.too_long": 61}  # its decorator counts
    assert oversize_functions(nested) == {"outer": 63, "outer.inner": 61}


def _module(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def test_the_cluster_knows_nothing_of_the_scenarios_or_the_trainer() -> None:
    imports = external_imports(E2E)
    allowed_in_e2e = ("e2e.cluster",)
    reached = {
        module: sorted(
            n
            for n in names
            if n.startswith(("maskrcnn_dist", "maskrcnn_launcher"))
            or (n.split(".")[0] == "e2e" and not n.startswith(allowed_in_e2e))
        )
        for module, names in imports.items()
        if module.startswith("e2e.cluster")
    }
    assert len(reached) >= 8, f"the cluster's modules were not read: {sorted(reached)}"
    assert {m: names for m, names in reached.items() if names} == {}


def test_the_scenarios_reach_the_cluster_only_through_its_interface() -> None:
    submodules = {_module(p) for p in CLUSTER.glob("*.py") if p.name != "__init__.py"}
    assert "e2e.cluster.jobset" in submodules
    imports = external_imports(E2E)
    reached = {
        module: sorted(n for n in names if n in submodules or n.startswith(tuple(f"{s}." for s in submodules)))
        for module, names in imports.items()
        if not module.startswith("e2e.cluster")
    }
    assert any("e2e.cluster.Cluster" in names for names in imports.values()), "no module imports the interface"
    assert {m: names for m, names in reached.items() if names} == {}
