"""The harness's scheduler (`python -m e2e run --jobs N`) without docker: which scenario starts when,
how many at once, what a failure or a stop does to the others, the summary's order.

Fake jobs on a fake clock (no process, no sleep) stand in for scenarios; one slow test runs a real
`ProcessJob` and stops it with a real SIGTERM.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from e2e.__main__ import _selected
from e2e.runner import ProcessJob, Terminated
from e2e.scenarios import DDP_ONLY, MEASURED_SECONDS, SCENARIOS, Result
from e2e.scenarios.bare_nodes import extract_recipe, name_containers
from e2e.schedule import Scheduler, longest_first


class Clock:
    """The scheduler's clock and sleep: time moves only when it sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.on_sleep: list = []  # callbacks run after each sleep: a test's signal arrives here

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        for callback in list(self.on_sleep):
            callback(self.now)


@dataclass
class FakeJob:
    """A scenario that lasts `seconds` and passes unless `ok` is false. Terminated, it ends at once
    (removing its "containers") unless `stubborn`, which needs a kill."""

    name: str
    clock: Clock
    seconds: float
    ok: bool = True
    stubborn: bool = False
    events: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.ends = self.clock.now + self.seconds
        self.outcome: Result | None = None
        self.events.append(f"start {self.name}")

    def done(self) -> bool:
        if self.outcome is None and self.clock.now >= self.ends:
            self.outcome = Result(self.name, self.ok, self.seconds, detail="" if self.ok else "failed")
            self.events.append(f"end {self.name}")
        return self.outcome is not None

    def result(self) -> Result:
        assert self.outcome is not None, "result() before done()"
        return self.outcome

    def terminate(self) -> None:
        self.events.append(f"terminate {self.name}")
        if not self.stubborn and self.outcome is None:
            self.outcome = Result(self.name, False, 0.0, detail="interrupted (SIGTERM); its containers removed")

    def kill(self) -> None:
        self.events.append(f"kill {self.name}")


class Harness:
    """A Scheduler over fake jobs; records what ran at once."""

    def __init__(self, seconds: dict[str, float], jobs: int, **job_options: dict) -> None:
        self.clock, self.seconds, self.options = Clock(), seconds, job_options
        self.events: list[str] = []
        self.live: dict[str, FakeJob] = {}
        self.most_at_once = 0
        self.scheduler = Scheduler(
            self.launch, jobs=jobs, grace=10.0, poll=1.0, clock=self.clock, sleep=self.clock.sleep
        )

    def launch(self, name: str) -> FakeJob:
        self.live = {n: j for n, j in self.live.items() if j.outcome is None}
        job = FakeJob(name, self.clock, self.seconds[name], events=self.events, **self.options.get(name, {}))
        self.live[name] = job
        self.most_at_once = max(self.most_at_once, len(self.live))
        return job

    def starts(self) -> list[str]:
        return [e.split()[1] for e in self.events if e.startswith("start ")]


SECONDS = {"a": 30.0, "b": 130.0, "c": 70.0, "d": 10.0, "e": 90.0}


def test_longest_first_by_the_measured_seconds() -> None:
    assert longest_first(list(SECONDS), SECONDS) == ["b", "e", "c", "a", "d"]
    # unmeasured (a new scenario) counts as the longest; ties keep their order
    assert longest_first(["a", "new", "d", "x"], {"a": 5, "d": 5, "x": 9}) == ["new", "x", "a", "d"]


def test_every_registered_scenario_has_a_measured_length() -> None:
    assert set(MEASURED_SECONDS) == set(SCENARIOS)


@pytest.mark.parametrize("jobs", [1, 2, 3])
def test_never_more_than_jobs_at_once_and_every_one_runs(jobs: int) -> None:
    h = Harness(SECONDS, jobs)
    order = longest_first(list(SECONDS), SECONDS)
    results = h.scheduler.run(list(SECONDS), order)
    assert h.most_at_once == jobs
    assert h.starts() == order
    assert [r.name for r in results] == list(SECONDS)  # the summary keeps the names' order
    assert all(r.ok for r in results)


def test_two_at_a_time_take_about_half_as_long() -> None:
    """Longest first on 2 jobs: 330 s of scenarios end after 170 s (b+a on one, e+c+d on the other),
    no job idle while a scenario waits (each start may wait one 1 s poll)."""
    serial, pair = Harness(SECONDS, 1), Harness(SECONDS, 2)
    serial.scheduler.run(list(SECONDS))
    pair.scheduler.run(list(SECONDS), longest_first(list(SECONDS), SECONDS))
    assert serial.clock.now >= sum(SECONDS.values())
    assert 170 <= pair.clock.now <= 170 + len(SECONDS)


def test_a_failure_is_its_own() -> None:
    h = Harness(SECONDS, 2, c={"ok": False})
    results = h.scheduler.run(list(SECONDS))
    assert {r.name: r.ok for r in results} == {"a": True, "b": True, "c": False, "d": True, "e": True}
    assert sorted(h.starts()) == sorted(SECONDS)


def test_a_scenario_that_cannot_start_fails_alone() -> None:
    h = Harness(SECONDS, 2)

    def launch(name: str) -> FakeJob:
        if name == "c":
            raise OSError("fork: no memory")
        return h.launch(name)

    h.scheduler.launch = launch
    results = {r.name: r for r in h.scheduler.run(list(SECONDS))}
    assert not results["c"].ok and "fork: no memory" in results["c"].detail
    assert all(results[n].ok for n in "abde")


def _sigterm_at(h: Harness, when: float) -> None:
    h.clock.on_sleep.append(lambda now: now >= when and h.scheduler.stop(signal.SIGTERM))


def test_a_stop_terminates_the_running_and_starts_nothing_more() -> None:
    h = Harness(SECONDS, 2)
    _sigterm_at(h, 35)  # a (30 s) has passed; b and c run; d and e wait
    results = {r.name: r for r in h.scheduler.run(list(SECONDS), ["a", "b", "c", "d", "e"])}
    assert h.starts() == ["a", "b", "c"]
    assert {e for e in h.events if e.startswith("terminate")} == {"terminate b", "terminate c"}
    assert results["a"].ok
    assert "interrupted" in results["b"].detail and "interrupted" in results["c"].detail
    assert results["d"].detail == results["e"].detail == "not run: the harness got SIGTERM"
    assert not any(e.startswith("kill") for e in h.events)
    assert h.scheduler.stopped_by == "SIGTERM"


def test_a_second_signal_changes_nothing() -> None:
    h = Harness(SECONDS, 2)
    _sigterm_at(h, 5)
    h.clock.on_sleep.append(lambda now: now >= 6 and h.scheduler.stop(signal.SIGINT))
    h.scheduler.run(list(SECONDS))
    assert h.scheduler.stopped_by == "SIGTERM"
    assert [e for e in h.events if e.startswith("terminate")] == ["terminate a", "terminate b"]


def test_a_scenario_that_ignores_the_stop_is_killed_after_the_grace() -> None:
    h = Harness(SECONDS, 2, b={"stubborn": True})
    _sigterm_at(h, 5)
    results = {r.name: r for r in h.scheduler.run(list(SECONDS))}
    assert "kill b" in h.events and "kill a" not in h.events
    assert results["b"].detail.startswith("killed: still running 10s after SIGTERM")
    assert 5 + 10 <= h.clock.now <= 5 + 10 + 2  # it waited out the grace, no longer


def test_selection_keeps_registry_order() -> None:
    assert _selected("jobset,pipeline", "", "pipeline,ddp") == ["pipeline", "jobset"]
    assert _selected("", "ddp-fault", "ddp") == [n for n in SCENARIOS if n in DDP_ONLY and n != "ddp-fault"]


def test_the_recipe_container_names_are_made_unique() -> None:
    recipe, _ = extract_recipe()
    renamed, names = name_containers(recipe, "e2e-0a1b2c-")
    assert names == ["e2e-0a1b2c-maskrcnn-master", "e2e-0a1b2c-maskrcnn-worker-0", "e2e-0a1b2c-maskrcnn-worker-1"]
    for old in ("maskrcnn-master", "maskrcnn-worker-0", "maskrcnn-worker-1"):
        # every use (docker run --name, docker logs, docker wait) follows the rename
        assert renamed.count(f"e2e-0a1b2c-{old}") == recipe.count(old) >= 1
        assert renamed.replace(f"e2e-0a1b2c-{old}", "").count(old) == 0


# -- a real process ---------------------------------------------------------------------------------


def _holds_a_resource(marker: Path) -> Result:
    """A stand-in scenario: it 'creates a container' (the marker) and removes it in `finally`, which
    takes a while (as `docker rm` does)."""
    marker.write_text("running")
    try:
        time.sleep(60)
    finally:
        marker.write_text("cleaning")
        time.sleep(1.0)
        marker.unlink()
    return Result("holder", True, 60.0)


def _wait_for(condition, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not within 30 s"
        time.sleep(0.02)


@pytest.mark.slow
def test_a_process_job_cleans_up_on_sigterm_and_reports(tmp_path: Path) -> None:
    """SIGTERM ends the scenario through its `finally`; a second one (timeout's signal to the process
    group, then the harness's own) arriving during that cleanup does not cut it short."""
    marker = tmp_path / "container"
    job = ProcessJob("holder", lambda: _holds_a_resource(marker))
    try:
        _wait_for(lambda: marker.exists())
        job.terminate()
        _wait_for(lambda: not marker.exists() or marker.read_text() == "cleaning")
        job.terminate()
        _wait_for(job.done)
        result = job.result()
        assert (result.name, result.ok) == ("holder", False)
        assert result.detail == "interrupted (SIGTERM); its containers removed"
        assert not marker.exists(), "the scenario's cleanup was cut short"
        assert job.process.exitcode == 0
    finally:
        job.kill()


@pytest.mark.slow
def test_a_process_job_that_dies_without_a_result_fails() -> None:
    job = ProcessJob("crash", lambda: os._exit(3))
    _wait_for(job.done)
    result = job.result()
    assert not result.ok and result.detail == "its process exited 3 with no result"


def test_terminated_is_not_an_exception_a_scenario_could_swallow() -> None:
    assert not issubclass(Terminated, Exception)
