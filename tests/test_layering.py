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


def _imports(path: Path, module: str, runtime: bool = False) -> Iterator[str]:
    """Absolute names of what `path` imports; `from package import name` yields package.name. `runtime`:
    only what importing it runs (not the names under `if TYPE_CHECKING:`)."""
    is_package = path.name == "__init__.py"
    for node in _nodes(ast.parse(path.read_text(), filename=str(path)), runtime):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(node, module, is_package) if node.level else node.module or ""
            yield target
            yield from (f"{target}.{alias.name}" for alias in node.names)


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The module a relative `from ... import` in `module` names."""
    base = module.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def _nodes(tree: ast.AST, runtime: bool) -> Iterator[ast.AST]:
    """Every node of `tree`; `runtime`: leaving out the bodies of `if TYPE_CHECKING:` (their else runs)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if runtime and isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))


def import_graph(package_dir: Path, runtime: bool = False) -> dict[str, set[str]]:
    """module -> the modules of the same package it imports (only names that are modules)."""
    files = {_module_name(p, package_dir): p for p in package_dir.rglob("*.py")}
    return {
        module: {name for name in _imports(path, module, runtime) if name in files and name != module}
        for module, path in files.items()
    }


def external_imports(package_dir: Path, runtime: bool = False) -> dict[str, set[str]]:
    files = {_module_name(p, package_dir): p for p in package_dir.rglob("*.py")}
    return {module: set(_imports(path, module, runtime)) for module, path in files.items()}


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


def unresolved_relative_imports(package_dir: Path) -> dict[str, list[str]]:
    """module -> the modules its relative imports name that the package lacks (`from .train import x` in
    a package that has no train module: the graph would silently leave it out, and it fails only when run)."""
    files = {_module_name(p, package_dir): p for p in package_dir.rglob("*.py")}
    found = {}
    for module, path in files.items():
        relative = (n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ImportFrom) and n.level)
        targets = (_absolute(node, module, path.name == "__init__.py") for node in relative)
        if missing := [target for target in targets if target not in files]:
            found[module] = missing
    return found


@pytest.mark.parametrize("package", [TRAINER, LAUNCHER], ids=["trainer", "launcher"])
def test_every_relative_import_names_a_module_of_the_package(package: Path) -> None:
    assert unresolved_relative_imports(package) == {}


def test_the_relative_import_reader_finds_a_module_the_package_lacks(tmp_path: Path) -> None:
    package = _write_package(
        tmp_path,
        {
            "train.py": "",
            "cli/run.py": "def run():\n    from .train import train\n    from ..train import train\n",
            "cli/__init__.py": "from .run import run\nfrom . import run\n",
        },
    )
    assert unresolved_relative_imports(package) == {"pkg.cli.run": ["pkg.cli.train"]}


@pytest.mark.parametrize("package", [TRAINER, LAUNCHER], ids=["trainer", "launcher"])
def test_no_import_cycle(package: Path) -> None:
    """A package that re-exports its modules counts: `from pkg import mod` inside pkg/x.py imports pkg,
    whose __init__ may import x."""
    assert cycles(import_graph(package)) == []


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The same imports between the packages' first floors: pkg.data.loader -> pkg.lifetime.stop is
    data -> lifetime (a top-level module is its own floor; the package's own __init__ is one too)."""

    def floor(module: str) -> str:
        return ".".join(module.split(".")[:2])

    found: dict[str, set[str]] = {}
    for module, imported in graph.items():
        found.setdefault(floor(module), set()).update(floor(i) for i in imported if floor(i) != floor(module))
    return found


@pytest.mark.parametrize("package", [TRAINER, LAUNCHER], ids=["trainer", "launcher"])
def test_no_loop_between_packages(package: Path) -> None:
    """Modules may import each other without a cycle and still tie their packages in a loop (modeling ->
    data -> lifetime -> modeling): then no package can be read, tested or moved without the others."""
    assert cycles(package_graph(import_graph(package))) == []


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
    "trainer_parts",  # the composition root's builder of the Trainer and its hooks
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
TRAINING_PATH = ("train", "trainer_parts", "training")
#: What the engines share; every other module of engines/ (a module or a package) is one engine.
ENGINES_SHARE = ("base", "prefetch")


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def tools_importing_the_training_path(graph: dict[str, set[str]], package: str) -> dict[str, list[str]]:
    """tool module -> the modules of the training path it imports (only offenders)."""
    tools = [m for m in graph if any(_within(m, f"{package}.{tool}") for tool in TOOLS)]
    found = {m: sorted(i for i in graph[m] if any(_within(i, f"{package}.{p}") for p in TRAINING_PATH)) for m in tools}
    return {m: imported for m, imported in found.items() if imported}


#: Modules that are one engine run another way: the ddp engine in an elastic group is the torch engine's.
ENGINE_VARIANTS = {"elastic_ddp": "torch_engine"}


def engine_of(module: str, package: str) -> str | None:
    """The engine a module belongs to (engines/torch_engine, engines/pipeline/...), None for what the
    engines share and for anything outside engines/."""
    parts = module.split(".")
    if parts[:2] != [package, "engines"] or len(parts) < 3 or parts[2] in ENGINES_SHARE:
        return None
    return ENGINE_VARIANTS.get(parts[2], parts[2])


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
    """predict, report, the gallery and profile build what they need (perf.setup_process, an engine);
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


def test_the_package_rule_finds_a_loop_of_packages_whose_modules_have_no_cycle(tmp_path: Path) -> None:
    package = _write_package(
        tmp_path,
        {
            "modeling/trained.py": "from ..data.sources import resolve\n",
            "modeling/perf.py": "",
            "data/sources/resolve.py": "from ...lifetime.cores import count\n",
            "lifetime/cores.py": "",
            "lifetime/process.py": "from ..modeling.perf import setup\n",
            "config.py": "",
            "train.py": "from .modeling import trained\nfrom . import config\n",  # above the loop: not in it
        },
    )
    graph = import_graph(package)
    assert cycles(graph) == []
    assert cycles(package_graph(graph)) == [["pkg.data", "pkg.lifetime", "pkg.modeling"]]


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
            "modeling/perf.py": "",
            "outputs/predict.py": "from ..train import setup_process\n",
            # allowed: a lower room, and a module whose name only starts like the training room's
            "outputs/draw.py": "from ..modeling.perf import setup_process\nfrom .. import training_data\n",
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


# --- data/: rooms importing downward, the rooms the command line reads before torch, the front door ----------

DATA = TRAINER / "data"
#: data/'s rooms (a sub-package or a top-level module), lowest first: a module imports only from its own
#: room or one below it. The order is what the code needs: the annotations' store is cached (cache), the
#: classes are judged from the store's counts, the sources carve a split from the annotations' image ids,
#: parse_ahead parses the sources' files, the images' check is read ahead (check_ahead) of the parse, the
#: synthetic set is written with the annotations' masks as sources, the dataset reads a store and images,
#: the plan orders an epoch (old_order: as it was before the plan), the loader batches it, transforms/ wrap
#: it and collate (copy-paste), and prepare composes them all.
DATA_ROOMS = (
    "cache",
    "annotations",
    "classes",
    "sources",
    "parse_ahead",
    "images",
    "check_ahead",
    "synthetic",
    "dataset",
    "plan",
    "old_order",
    "loader",
    "transforms",
    "prepare",
)
#: What the command line reads before torch loads (it parses a large annotation file meanwhile): these
#: rooms, and everything of the trainer they import, never import torch.
TORCH_FREE_ROOMS = ("annotations", "sources", "cache", "classes", "parse_ahead")


def room_of(module: str, package: str) -> str | None:
    """The room of data/ a module sits in (None: outside data/, or data/__init__, the package's names)."""
    parts = module.split(".")
    if parts[:2] != [package, "data"] or len(parts) < 3:
        return None
    return parts[2]


def upward_data_imports(graph: dict[str, set[str]], package: str, rooms: tuple[str, ...]) -> dict[str, list[str]]:
    """data/ module -> the data/ modules of higher rooms it imports (only offenders)."""
    rank = {room: i for i, room in enumerate(rooms)}
    offenders = {}
    for module, imported in graph.items():
        own = room_of(module, package)
        if own is None:
            continue
        up = sorted(i for i in imported if (room := room_of(i, package)) is not None and rank[room] > rank[own])
        if up:
            offenders[module] = up
    return offenders


def torch_reached(package_dir: Path, package: str, rooms: tuple[str, ...]) -> dict[str, list[str]]:
    """module of those rooms -> the torch imports found in it or in any trainer module it reaches
    (its own imports, transitively, and the packages that hold them: importing a module runs them).
    What runs only for a type checker (`if TYPE_CHECKING:`) is left out: importing never runs it."""
    graph, external = import_graph(package_dir, runtime=True), external_imports(package_dir, runtime=True)
    found = {}
    for module in graph:
        if room_of(module, package) not in rooms:
            continue
        seen, todo = set(), [module]
        while todo:
            current = todo.pop()
            if current in seen:
                continue
            seen.add(current)
            parents = [".".join(current.split(".")[:k]) for k in range(1, current.count(".") + 1)]
            todo += [m for m in (*graph.get(current, ()), *parents) if m in graph]
        torch = sorted({n for m in seen for n in external[m] if n.split(".")[0] in ("torch", "torchvision")})
        if torch:
            found[module] = torch
    return found


def test_data_rooms_import_downward_only() -> None:
    graph = import_graph(TRAINER)
    rooms = {room_of(m, "maskrcnn_dist") for m in graph} - {None}
    assert rooms == set(DATA_ROOMS), "every room of data/ has its place in DATA_ROOMS"
    assert upward_data_imports(graph, "maskrcnn_dist", DATA_ROOMS) == {}


def test_the_rooms_the_command_line_parses_with_never_import_torch() -> None:
    assert torch_reached(TRAINER, "maskrcnn_dist", TORCH_FREE_ROOMS) == {}


def test_data_has_a_front_door_and_few_modules_at_its_top() -> None:
    """At most 12 modules at data/'s top level; train.py reaches data/ through at most 2 of its modules."""
    assert len([p for p in DATA.glob("*.py")]) <= 12
    train = {i for i in import_graph(TRAINER)["maskrcnn_dist.train"] if _within(i, "maskrcnn_dist.data")}
    assert len(train) <= 2, sorted(train)


def test_no_method_changes_a_dataset_after_it_is_built() -> None:
    """The dataset (and the split it is built from) set their attributes while they are made, nowhere
    else: the data check's verdicts are decided before (data/prepare.py)."""
    assert dataset_mutators(DATA / "dataset.py", ("CocoInstanceDataset", "Split")) == {}


#: The methods that make a dataset: its constructors, and the one they share.
MAKERS = ("__init__", "_hold")


def dataset_mutators(path: Path, classes: tuple[str, ...]) -> dict[str, list[str]]:
    """class.method -> the attributes of self it assigns (or changes in place: x[k] = v, x.update(...))
    outside MAKERS; a maker called from anything but a constructor counts too."""
    tree = ast.parse(path.read_text())
    found: dict[str, list[str]] = {}
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name in classes):
        for method in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
            changed = []
            for node in ast.walk(method):
                targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
                for target in targets if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign) else []:
                    while isinstance(target, ast.Subscript | ast.Attribute) and not _on_self(target):
                        target = target.value
                    if _on_self(target):
                        changed.append(ast.unparse(target))
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                    name, owner = node.func.attr, node.func.value
                    if name in ("update", "append", "extend", "pop", "clear", "setdefault") and _reaches_self(owner):
                        changed.append(ast.unparse(node.func))
                    if name in MAKERS[1:] and method.name not in ("__init__", "of"):
                        changed.append(ast.unparse(node.func))
            if changed and method.name not in MAKERS:
                found[f"{cls.name}.{method.name}"] = changed
    return found


def _on_self(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"


def _reaches_self(node: ast.AST) -> bool:
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
    return isinstance(node, ast.Name) and node.id == "self"


def test_the_data_rules_find_an_upward_import_torch_and_a_mutator(tmp_path: Path) -> None:
    """The data checks above would pass on readers that see nothing: show each sees its fault."""
    package = _write_package(
        tmp_path,
        {
            "data/cache.py": "",
            "data/annotations/store.py": "from ..dataset import Dataset\n",  # upward
            "data/annotations/masks.py": "from ...lifetime import heavy\n",  # torch, one module away
            "lifetime/heavy.py": "import torch\n",
            "data/sources/resolve.py": "from ..annotations import masks\nfrom ..cache import x\n",
            # for readers only: never run, so detect.py reaches no torch through its package
            "data/sources/__init__.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ...lifetime import heavy\n"
            ),
            "data/sources/detect.py": "",
            "data/dataset.py": (
                "class CocoInstanceDataset:\n"
                "    def __init__(self):\n        self.rows = []\n"
                "    def drop_images(self, ids):\n        self.rows = [r for r in self.rows if r not in ids]\n"
                "    def use_frames(self, frames):\n        self._frames.update(frames)\n"
                "    def frame(self, i):\n        return self._frames[i]\n"
            ),
        },
    )
    graph = import_graph(package)
    rooms = ("cache", "annotations", "sources", "dataset")
    assert upward_data_imports(graph, "pkg", rooms) == {"pkg.data.annotations.store": ["pkg.data.dataset"]}
    assert "pkg.lifetime.heavy" in graph["pkg.data.sources"]  # a reader's dependency all the same
    assert torch_reached(package, "pkg", ("annotations", "sources")) == {
        "pkg.data.annotations.masks": ["torch"],
        "pkg.data.sources.resolve": ["torch"],
    }
    assert dataset_mutators(package / "data" / "dataset.py", ("CocoInstanceDataset",)) == {
        "CocoInstanceDataset.drop_images": ["self.rows"],
        "CocoInstanceDataset.use_frames": ["self._frames.update"],
    }
