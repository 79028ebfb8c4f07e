"""Who holds the stop request: the engines get it at construction (from their engine's entry, engines.ENGINES),
and a pipeline process's RPC handlers reach it through the registration its session makes, not through
the signal table. In-process, no training, no RPC group."""

from __future__ import annotations

import contextlib
import importlib
import signal

import pytest
from maskrcnn_launcher.contract import PodPlan, StagePlacement

from maskrcnn_dist.engines import engine_entry, pipeline, torch_engine
from maskrcnn_dist.engines.pipeline import runtime
from maskrcnn_dist.engines.torch_engine import TorchEngine
from maskrcnn_dist.lifetime.stop import Stopped, StopRequest, stop_on_signals

from .conftest import fast_config

train_mod = importlib.import_module("maskrcnn_dist.train")  # the module, whatever the package re-exports


class Recorded:
    """An engine class stand-in that records how it was built."""

    def __init__(self, *args, **kwargs) -> None:
        self.args, self.kwargs = args, kwargs


def test_a_torch_engine_holds_the_request_it_was_built_with(tmp_path) -> None:
    stop = StopRequest()
    engine = TorchEngine(fast_config(tmp_path, tmp_path / "out"), num_classes=3, iters_per_epoch=1, stop=stop)
    assert engine.stop is stop and not engine.stop_after_step()
    stop.request("a test")
    assert engine.stop_after_step() and engine.agree_to_stop()


@pytest.mark.parametrize("engine", ["local", "ddp"])
def test_the_composition_root_builds_torch_engines_with_the_process_s_request(monkeypatch, tmp_path, engine) -> None:
    monkeypatch.setattr(torch_engine, "TorchEngine", Recorded)
    monkeypatch.setattr(torch_engine, "process_group", lambda cfg: contextlib.nullcontext(2))
    cfg = fast_config(tmp_path, tmp_path / "out", engine=engine)
    stop = StopRequest()
    with engine_entry(cfg).session(cfg, None, stop) as (make_engine, _world_size):
        built = make_engine(3, 4)
    assert built.kwargs["stop"] is stop


def test_the_pipeline_master_s_engine_and_session_get_the_process_s_request(monkeypatch, tmp_path) -> None:
    sessions: list[StopRequest | None] = []

    @contextlib.contextmanager
    def session(cfg, plan, stop=None):
        sessions.append(stop)
        yield

    monkeypatch.setattr(pipeline, "PipelineEngine", Recorded)
    monkeypatch.setattr(pipeline, "master_session", session)
    cfg = fast_config(tmp_path, tmp_path / "out", engine="pipeline")
    plan = _plan("master")
    stop = StopRequest()
    with engine_entry(cfg).session(cfg, plan, stop) as (make_engine, _world_size):
        built = make_engine(3, 4)
    assert built.kwargs["stop"] is stop and sessions == [stop]


def test_train_without_a_request_installs_nothing(monkeypatch, tmp_path) -> None:
    """A library caller that passes no request gets a plain one: no signal handler goes in."""
    before = signal.getsignal(signal.SIGTERM)
    given: list[tuple[StopRequest, object]] = []
    monkeypatch.setattr(
        train_mod, "_train", lambda cfg, plan, stop, *_: given.append((stop, signal.getsignal(signal.SIGTERM)))
    )
    train_mod.train(fast_config(tmp_path, tmp_path / "out"))
    [(stop, while_training)] = given
    assert isinstance(stop, StopRequest) and not stop.requested
    assert while_training == before and signal.getsignal(signal.SIGTERM) == before


# -- the pipeline's RPC handlers -----------------------------------------------------------------


def test_a_worker_s_stop_reaches_the_registered_request_and_nothing_else() -> None:
    registered = StopRequest()
    with stop_on_signals() as installed:  # the signal table holds another request: it is not asked
        with runtime.RPC_STOP.registered(registered):
            runtime._stop_requested("worker2", "SIGTERM")
    assert registered.reason == "SIGTERM on worker2"
    assert not installed.requested


def test_with_nothing_registered_an_rpc_stop_is_dropped() -> None:
    assert runtime.RPC_STOP.request is None
    with stop_on_signals() as installed:
        runtime._stop_requested("worker1", "SIGTERM")  # no error: no session, nothing to stop
        runtime._session_stopped("checkpoint of step 3")
    assert not installed.requested and not installed.done


def test_the_registration_lasts_its_block_even_when_it_raises_and_one_at_a_time() -> None:
    stop = StopRequest()
    with pytest.raises(ValueError):
        with runtime.RPC_STOP.registered(stop):
            assert runtime.RPC_STOP.request is stop
            with pytest.raises(RuntimeError, match="one session at a time"):
                with runtime.RPC_STOP.registered(StopRequest()):
                    pass
            assert runtime.RPC_STOP.request is stop
            raise ValueError
    assert runtime.RPC_STOP.request is None


def _plan(role: str) -> PodPlan:
    """A two-process pipeline's plan, as the launcher gives `role`."""
    stage = StagePlacement(1, "stage1", 0, 1, "worker1", ("transform", "backbone", "rpn", "roi_heads"), ("cpu",))
    name = "master" if role == "master" else "worker1"
    return PodPlan("pipeline", role, 0, int(role != "master"), 2, name, "127.0.0.1", 29500, "gloo", (stage,), "cpu", {})


def test_the_master_s_session_registers_its_request_while_it_runs(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(runtime, "join_rpc", lambda *args: None)
    monkeypatch.setattr(runtime, "_end_session", lambda cfg, plan: None)
    stop = StopRequest()
    with runtime.master_session(fast_config(tmp_path, tmp_path / "out"), _plan("master"), stop):
        runtime._stop_requested("worker1", "SIGINT")
    assert stop.reason == "SIGINT on worker1"
    assert runtime.RPC_STOP.request is None


def test_a_stage_worker_serving_receives_the_master_s_stop_through_its_registration(monkeypatch, tmp_path) -> None:
    class Idle:
        def __init__(self, *args) -> None:
            pass

        def start(self):
            return self

        def stop(self) -> None:
            pass

    class Store:
        def set(self, key, value) -> None:
            pass

    monkeypatch.setattr(runtime, "join_rpc", lambda *args: None)
    monkeypatch.setattr(runtime, "MasterWatchdog", Idle)
    monkeypatch.setattr(runtime, "StopForwarder", Idle)
    monkeypatch.setattr(runtime, "_store_client", lambda plan, timeout: Store())
    # While the worker serves (inside RPC's shutdown), the master ends the session on a stop.
    monkeypatch.setattr(runtime.rpc, "shutdown", lambda graceful: runtime._session_stopped("checkpoint of step 3"))
    stop = StopRequest()
    with pytest.raises(Stopped) as stopped:
        runtime.serve(fast_config(tmp_path, tmp_path / "out"), _plan("worker"), stop)
    assert stopped.value.request is stop and stop.done
    assert (stop.reason, stop.saved) == ("the master's stop", "the master's checkpoint of step 3")
    assert runtime.RPC_STOP.request is None
