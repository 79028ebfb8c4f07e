"""Who may import whom (docs/architecture.md), read from the source with `ast`, not by running it.

Every import counts, including those inside functions and under TYPE_CHECKING: a lazy import is still
a dependency a reader has to follow.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TRAINER = ROOT / "src" / "maskrcnn_dist"
LAUNCHER = ROOT / "launcher" / "maskrcnn_launcher"


def _module_name(path: Path, package_dir: Path) -> str:
    parts = [package_dir.name, *path.relative_to(package_dir).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, module: str) -> Iterator[str]:
    """Absolute names of what `path` imports; `from package import name` yields package.name."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            yield target
            yield from (f"{target}.{alias.name}" for alias in node.names)


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    """module -> the modules of the same package it imports (only names that are modules)."""
    files = {_module_name(p, package_dir): p for p in package_dir.rglob("*.py")}
    return {
        module: {name for name in _imports(path, module) if name in files and name != module}
        for module, path in files.items()
    }


def external_imports(package_dir: Path) -> dict[str, set[str]]:
    files = {_module_name(p, package_dir): p for p in package_dir.rglob("*.py")}
    return {module: set(_imports(path, module)) for module, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


@pytest.mark.parametrize("package", [TRAINER, LAUNCHER], ids=["trainer", "launcher"])
def test_no_import_cycle(package: Path) -> None:
    """A package that re-exports its modules counts: `from pkg import mod` inside pkg/x.py imports pkg,
    whose __init__ may import x."""
    assert cycles(import_graph(package)) == []


def test_engines_never_import_the_run_the_composition_root_the_tools_or_the_cli() -> None:
    upward = ("train", "cli", "training", "outputs", "profile")
    graph = import_graph(TRAINER)
    offenders = {
        m: sorted(i for i in graph[m] if any(_within(i, f"maskrcnn_dist.{up}") for up in upward))
        for m in graph
        if _within(m, "maskrcnn_dist.engines")
    }
    assert {m: up for m, up in offenders.items() if up} == {}


#: The floors above the engines; everything else of the trainer sits under them.
ABOVE_ENGINES = (
    "engines",
    "training",  # the run: the loop, its hooks and what they keep
    "train",
    "cli",
    "torchrun",
    "outputs",  # predict and the report's gallery run the local engine, beside the loop
    "profile",  # profile runs pipeline stages, beside the loop
)


def above_engines(module: str, package: str) -> bool:
    return any(_within(module, f"{package}.{floor}") for floor in ABOVE_ENGINES)


def test_lower_layers_never_import_engines_or_above() -> None:
    """modeling/, lifetime/, data/, config/, evaluation, checkpoints, errors and the run folder's names sit
    under the engines."""
    graph = import_graph(TRAINER)
    lower = [m for m in graph if not above_engines(m, "maskrcnn_dist") and m != "maskrcnn_dist"]
    assert "maskrcnn_dist.modeling.model" in lower and "maskrcnn_dist.training.loop" not in lower
    assert "maskrcnn_dist.training" not in lower and "maskrcnn_dist.train" not in lower
    offenders = {m: sorted(i for i in graph[m] if above_engines(i, "maskrcnn_dist")) for m in lower}
    assert {m: i for m, i in offenders.items() if i} == {}


#: The tools: commands beside the loop that run a model or measure one, never train it.
TOOLS = ("outputs", "profile")
#: The training path, which no tool imports: the composition root and the run (training/).
TRAINING_PATH = ("train", "training")
#: What the engines share; every other module of engines/ (a module or a package) is one engine.
ENGINES_SHARE = ("base", "prefetch")


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def tools_importing_the_training_path(graph: dict[str, set[str]], package: str) -> dict[str, list[str]]:
    """tool module -> the modules of the training path it imports (only offenders)."""
    tools = [m for m in graph if any(_within(m, f"{package}.{tool}") for tool in TOOLS)]
    found = {m: sorted(i for i in graph[m] if any(_within(i, f"{package}.{p}") for p in TRAINING_PATH)) for m in tools}
    return {m: imported for m, imported in found.items() if imported}


def engine_of(module: str, package: str) -> str | None:
    """The engine a module belongs to (engines/torch_engine, engines/pipeline/...), None for what the
    engines share and for anything outside engines/."""
    parts = module.split(".")
    if parts[:2] != [package, "engines"] or len(parts) < 3 or parts[2] in ENGINES_SHARE:
        return None
    return parts[2]


def engines_importing_another_engine(graph: dict[str, set[str]], package: str) -> dict[str, list[str]]:
    """engine module -> the modules of other engines it imports (only offenders)."""
    offenders = {}
    for module, imported in graph.items():
        own = engine_of(module, package)
        other = sorted(i for i in imported if engine_of(i, package) not in (None, own))
        if own is not None and other:
            offenders[module] = other
    return offenders


def test_tools_never_import_the_training_path() -> None:
    """predict, report, the gallery and profile build what they need (process.setup_process, an engine);
    they never reach into train.py or the loop."""
    assert tools_importing_the_training_path(import_graph(TRAINER), "maskrcnn_dist") == {}


def test_no_engine_imports_another_engine() -> None:
    """What two engines share lives in engines/base.py, not in one of them."""
    graph = import_graph(TRAINER)
    assert engine_of("maskrcnn_dist.engines.pipeline.engine", "maskrcnn_dist") == "pipeline"
    assert engine_of("maskrcnn_dist.engines.torch_engine", "maskrcnn_dist") == "torch_engine"
    assert engines_importing_another_engine(graph, "maskrcnn_dist") == {}


#: `maskrcnn-dist profile` plans for a topology and writes one: it reads and validates them with the
#: launcher's own parser (a second parser could drift from the one `plan` and `launch` use). Only there.
PROFILE_READS = ("maskrcnn_launcher.topology", "maskrcnn_launcher.errors")


def test_the_trainer_meets_the_launcher_only_through_its_contract() -> None:
    def allowed(module: str, name: str) -> bool:
        if module.startswith("maskrcnn_dist.profile.") and name.startswith(PROFILE_READS):
            return True
        return _is_contract(name)

    reached = {
        module: sorted(n for n in names if n.startswith("maskrcnn_launcher") and not allowed(module, n))
        for module, names in external_imports(TRAINER).items()
    }
    assert {m: names for m, names in reached.items() if names} == {}


def _is_contract(name: str) -> bool:
    # `from maskrcnn_launcher.contract import X` yields the module and maskrcnn_launcher.contract.X.
    return name == "maskrcnn_launcher.contract" or name.startswith("maskrcnn_launcher.contract.")


def test_the_launcher_never_imports_torch() -> None:
    torch_users = {
        module: sorted(n for n in names if n == "torch" or n.startswith(("torch.", "torchvision")))
        for module, names in external_imports(LAUNCHER).items()
    }
    assert {m: names for m, names in torch_users.items() if names} == {}


def test_the_graph_reader_finds_a_cycle_and_an_upward_import(tmp_path: Path) -> None:
    """The checks above would pass on a reader that sees nothing: show it sees both kinds of fault."""
    package = tmp_path / "pkg"
    (package / "engines").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from . import b\n")
    (package / "b.py").write_text("def f():\n    from .a import x\n")
    (package / "engines" / "__init__.py").write_text("")
    (package / "engines" / "e.py").write_text("from ..train import run\n")
    (package / "train.py").write_text("from .engines import e\n")
    graph = import_graph(package)
    assert ["pkg.a", "pkg.b"] in cycles(graph)
    assert "pkg.train" in graph["pkg.engines.e"]


def _write_package(root: Path, files: dict[str, str]) -> Path:
    """A package `pkg` under root: module path -> source; every folder gets an empty __init__.py."""
    package = root / "pkg"
    for name, source in files.items():
        path = package / name
        for folder in path.relative_to(package).parents:  # ..., ".": the package itself
            (package / folder).mkdir(parents=True, exist_ok=True)
            (package / folder / "__init__.py").touch()
        path.write_text(source)
    return package


def test_the_tools_rule_finds_a_tool_importing_the_training_path(tmp_path: Path) -> None:
    package = _write_package(
        tmp_path,
        {
            "train.py": "",
            "training/loop.py": "",
            "training_data.py": "",  # not the training room: a name that starts the same
            "lifetime/process.py": "",
            "outputs/predict.py": "from ..train import setup_process\n",
            # allowed: a lower room, and a module whose name only starts like the training room's
            "outputs/draw.py": "from ..lifetime.process import setup_process\nfrom .. import training_data\n",
            "profile/command.py": "def run():\n    from ..training import loop\n",  # lazy, still counted
        },
    )
    assert tools_importing_the_training_path(import_graph(package), "pkg") == {
        "pkg.outputs.predict": ["pkg.train"],
        "pkg.profile.command": ["pkg.training", "pkg.training.loop"],
    }


def test_the_engines_rule_finds_an_engine_importing_another(tmp_path: Path) -> None:
    package = _write_package(
        tmp_path,
        {
            "engines/base.py": "",
            "engines/torch_engine.py": "from .base import Engine\nfrom .pipeline import stages\n",
            "engines/pipeline/stages.py": "from ..base import Images\n",  # allowed: the shared module
            "engines/pipeline/engine.py": "from ..torch_engine import check_finite\nfrom .stages import State\n",
        },
    )
    assert engines_importing_another_engine(import_graph(package), "pkg") == {
        "pkg.engines.pipeline.engine": ["pkg.engines.torch_engine"],
        "pkg.engines.torch_engine": ["pkg.engines.pipeline", "pkg.engines.pipeline.stages"],
    }
