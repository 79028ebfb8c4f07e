"""Engines as entries (engines/__init__.py): each engine's needs of its process are its entry, the
composition root asks the entry and never names an engine, and a change to an entry changes what the
root does. In-process: no group, no training."""

from __future__ import annotations

import ast
import contextlib
from pathlib import Path

import pytest
from maskrcnn_launcher.contract import MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, PodPlan, StagePlacement

from maskrcnn_dist import config, engines
from maskrcnn_dist import train as composition
from maskrcnn_dist.data.prepare import OpenedData
from maskrcnn_dist.engines import ENGINES, EngineEntry, engine_entry
from maskrcnn_dist.errors import ConfigError
from maskrcnn_dist.lifetime.stop import Stopped, StopRequest

from ..conftest import fast_config

SRC = Path(__file__).resolve().parents[3] / "src" / "maskrcnn_dist"
#: Where an engine's name may still be read outside engines/ and config/, and why: the profiler predicts
#: each engine's speed with a cost model of its own (profile/); `demo --engine` picks which command runs
#: the job (the launcher for the pipeline's three processes); parse_ahead decides, before torch loads,
#: whether this process reads data at all (a pipeline stage worker does not): data/ sits under engines/.
NAMES_ENGINES = ("profile/", "cli/run.py", "data/parse_ahead.py")


def engine_name_tests(path: Path, names: tuple[str, ...] = tuple(ENGINES)) -> list[str]:
    """`line: source` of each comparison in `path` that reads an engine's name: `x.engine` compared with
    anything, or anything compared with an engine's name (==, !=, in)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        reads_engine = any(isinstance(s, ast.Attribute) and s.attr == "engine" for s in sides)
        names_one = any(isinstance(c, ast.Constant) and c.value in names for s in sides for c in ast.walk(s))
        if reads_engine or names_one:
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_composition_root_never_tests_an_engine_s_name() -> None:
    for module in ("train.py", "trainer_parts.py"):
        assert engine_name_tests(SRC / module) == [], module


def test_outside_engines_and_config_only_the_named_places_test_an_engine_s_name() -> None:
    readers = sorted(
        str(path.relative_to(SRC))
        for path in SRC.rglob("*.py")
        if path.relative_to(SRC).parts[0] not in ("engines", "config") and engine_name_tests(path)
    )
    assert readers and all(r.startswith(NAMES_ENGINES) for r in readers), readers


def test_the_name_reader_sees_a_test_of_an_engine_s_name(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "if cfg.engine == 'ddp':\n    pass\n"
        "kind = 'pipeline' if x else 'y'\n"  # a name, not a test of one
        "if mode in ('local', 'other'):\n    pass\n"
        "if opts.engine_count > 1:\n    pass\n"
    )
    assert engine_name_tests(module) == ["1: cfg.engine == 'ddp'", "4: mode in ('local', 'other')"]


def test_every_engine_the_config_accepts_has_one_entry() -> None:
    assert tuple(ENGINES) == config.ENGINES
    assert all(entry.name == name for name, entry in ENGINES.items())


def test_each_entry_states_its_engine_s_needs() -> None:
    local, ddp, pipeline = ENGINES["local"], ENGINES["ddp"], ENGINES["pipeline"]
    assert (local.alone, ddp.alone, pipeline.alone) == (True, False, False)
    assert (local.torchrun, ddp.torchrun, pipeline.torchrun) == (False, True, False)
    assert (local.checks_data_first, ddp.checks_data_first, pipeline.checks_data_first) == (True, False, True)
    assert (local.reads_device, ddp.reads_device, pipeline.reads_device) == (True, True, False)


def test_torchrun_s_environment_is_required_by_the_engine_that_runs_under_it() -> None:
    full = {RANK: "1", WORLD_SIZE: "2", MASTER_ADDR: "h", MASTER_PORT: "1"}
    ENGINES["ddp"].check_environment(full)
    with pytest.raises(ConfigError, match=f"--engine ddp runs under torchrun.*{WORLD_SIZE}, {MASTER_PORT} not set"):
        ENGINES["ddp"].check_environment({RANK: "1", MASTER_ADDR: "h"})
    ENGINES["local"].check_environment({})
    assert not ENGINES["ddp"].is_main_process(full) and ENGINES["ddp"].is_main_process({**full, RANK: "0"})
    assert ENGINES["local"].is_main_process(full) and ENGINES["pipeline"].is_main_process(full)


def test_only_an_engine_alone_stops_before_its_first_step() -> None:
    stop = StopRequest()
    stop.request("a test")
    with pytest.raises(Stopped):
        ENGINES["local"].stop_before_start(stop, "data loading")
    ENGINES["ddp"].stop_before_start(stop, "data loading")  # its peers form their group first
    ENGINES["pipeline"].stop_before_start(stop, "data loading")


def _plan(role: str) -> PodPlan:
    stage = StagePlacement(1, "stage1", 0, 1, "worker1", ("transform", "backbone", "rpn", "roi_heads"), ("cpu",))
    name = "master" if role == "master" else "worker1"
    return PodPlan("pipeline", role, 0, int(role != "master"), 2, name, "127.0.0.1", 29500, "gloo", (stage,), "cpu", {})


def test_the_pipeline_s_stage_workers_serve_and_its_master_trains(tmp_path: Path) -> None:
    cfg = fast_config(tmp_path, tmp_path / "out", engine="pipeline")
    assert engine_entry(cfg).server(cfg, _plan("master")) is None
    assert callable(engine_entry(cfg).server(cfg, _plan("worker")))
    assert ENGINES["ddp"].server(cfg, None) is None and ENGINES["local"].server(cfg, None) is None


class Reached(Exception):
    """Where the recording engine factory stops the run: the data is built, the engine asked for."""


def test_the_composition_root_does_what_the_entry_says(monkeypatch, four_images: Path, tmp_path: Path) -> None:
    """The local engine's entry swapped for one that checks the data in its group: train() builds the
    datasets inside the session, through the factory's on_rank0, and asks the entry for its environment
    and main process; it never looks at the engine's name."""
    calls: list[str] = []

    class Factory:
        def __call__(self, num_classes: int, iters: int) -> None:
            calls.append("engine")
            raise Reached

        def on_rank0(self, compute):
            calls.append("on_rank0")
            return compute()

    @contextlib.contextmanager
    def session(cfg, plan, stop):
        calls.append("session")
        yield Factory(), 1

    class Recording(EngineEntry):
        def check_environment(self, env=None) -> None:
            calls.append("environment")

        def is_main_process(self, env=None) -> bool:
            calls.append("main?")
            return True

    build = OpenedData.build
    monkeypatch.setattr(OpenedData, "build", lambda *args: calls.append("build") or build(*args))
    monkeypatch.setitem(engines.ENGINES, "local", Recording("local", session, checks_data_first=False))
    cfg = fast_config(four_images, tmp_path / "out")
    with pytest.raises(Reached):
        composition.train(cfg)
    assert calls == ["environment", "main?", "session", "build", "on_rank0", "engine"]
    # The same run with the data checked first: built before the session opens, on_rank0 never asked.
    calls.clear()
    monkeypatch.setitem(engines.ENGINES, "local", Recording("local", session, checks_data_first=True))
    with pytest.raises(Reached):
        composition.train(fast_config(four_images, tmp_path / "out2"))
    assert calls == ["environment", "main?", "build", "session", "engine"]
