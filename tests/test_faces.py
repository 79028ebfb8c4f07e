"""The package faces `maskrcnn_launcher.contract` and `maskrcnn_dist.config`: each of their modules
declares its public names in `__all__`, once, and the face star-imports every module and composes its
`__all__` from theirs. Here: every module is part of the face, every exported name resolves, none is
private or exported twice, and the face binds nothing public beyond `__all__` and its modules.
`maskrcnn_dist.data` imports its names lazily: its TYPE_CHECKING block names the same homes.
"""

from __future__ import annotations
import __future__

import ast
import importlib
import pkgutil
import types
from pathlib import Path

import pytest

FACES = ("maskrcnn_launcher.contract", "maskrcnn_dist.config")


def modules_of(face: types.ModuleType) -> dict[str, types.ModuleType]:
    """Every module of the face's package, imported, by short name."""
    return {
        info.name: importlib.import_module(f"{face.__name__}.{info.name}")
        for info in pkgutil.iter_modules(face.__path__)
    }


@pytest.mark.parametrize("name", FACES)
def test_every_exported_name_resolves_once_and_is_public(name: str) -> None:
    face = importlib.import_module(name)
    exported = list(face.__all__)
    assert exported, f"{name}.__all__ is empty"
    twice = sorted({n for n in exported if exported.count(n) > 1})
    assert not twice, f"{name}.__all__ names these twice (two modules export them?): {twice}"
    private = [n for n in exported if n.startswith("_")]
    assert not private, f"{name}.__all__ exports private names: {private}"
    missing = [n for n in exported if not hasattr(face, n)]
    assert not missing, f"{name}.__all__ names what the face does not bind: {missing}"


@pytest.mark.parametrize("name", FACES)
def test_every_module_declares_its_names_and_the_face_exports_them(name: str) -> None:
    face = importlib.import_module(name)
    exported = set(face.__all__)
    for short, module in modules_of(face).items():
        assert isinstance(getattr(module, "__all__", None), list), (
            f"{module.__name__} declares no `__all__` list: the face star-imports it, so it must say which of "
            "its names are public"
        )
        left_out = sorted(set(module.__all__) - exported)
        assert not left_out, (
            f"{name} does not export {module.__name__}'s {left_out}: add `from ... {short} import *` and "
            f"`*{short}.__all__` to {name}'s __init__.py"
        )
        for public in module.__all__:
            assert getattr(face, public) is getattr(module, public), f"{name}.{public} is not {module.__name__}'s"


@pytest.mark.parametrize("name", FACES)
def test_the_face_binds_nothing_public_beyond_its_all(name: str) -> None:
    """What a star import of a module without `__all__` would leak (its own imports: `re`, `json`,
    `Path`...), or a name imported into the face by hand but not exported."""
    face = importlib.import_module(name)
    bound = {
        n
        for n, value in vars(face).items()
        if not n.startswith("_")
        and not isinstance(value, types.ModuleType)  # its modules
        and value is not __future__.annotations  # `from __future__ import annotations` binds it
    }
    unexported = sorted(bound - set(face.__all__))
    assert not unexported, f"{name} binds public names its __all__ does not export: {unexported}"


# --- maskrcnn_dist.data: names imported when first asked for, and the same names for readers ------------


def type_checking_homes(path: Path) -> dict[str, str]:
    """name -> its module (relative to the package, dotted) for each `from .module import name` under the
    face's `if TYPE_CHECKING:`."""
    homes: dict[str, str] = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for imported in (n for n in node.body if isinstance(n, ast.ImportFrom) and n.level == 1):
                for alias in imported.names:
                    homes[alias.asname or alias.name] = imported.module or ""
    return homes


def test_the_data_face_names_every_lazy_name_for_readers_where_it_lives() -> None:
    """data/__init__.py maps names to modules at run time (_HOME, PEP 562) so that the command line can
    import sources/ before torch; its TYPE_CHECKING block imports the same names from the same modules,
    so that a reader or an editor can follow them."""
    face = importlib.import_module("maskrcnn_dist.data")
    assert type_checking_homes(Path(face.__file__)) == face._HOME
    for name, home in face._HOME.items():
        assert getattr(face, name) is getattr(importlib.import_module(f"{face.__name__}.{home}"), name), name


def test_the_type_checking_reader_sees_each_name_and_its_module(tmp_path: Path) -> None:
    face = tmp_path / "face.py"
    face.write_text(
        "from typing import TYPE_CHECKING\n"
        "from .elsewhere import not_read\n"  # not under TYPE_CHECKING
        "if TYPE_CHECKING:\n"
        "    from .plan import a, b as c\n"
        "    from .images.check import d\n"
    )
    assert type_checking_homes(face) == {"a": "plan", "c": "plan", "d": "images.check"}
