"""The suite's time budget (tests/hack/timings.py) decides by the baseline's seconds, never by this
machine's clock: a run's seconds are divided by its machine factor first. And the committed baseline
itself stays within the budgets that README and .ci/run promise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hack import mutations
from hack import timings as budget
from longest_first import longest_first, seconds_per_file
from test_tiers import run_project
from timings import Cost, Timings


def run_of(walls: dict[str, float], factor: float = 1.0, markers: dict[str, list[str]] | None = None):
    tests = {
        name: budget.Test(name, wall * factor, wall, "passed", tuple((markers or {}).get(name, ())))
        for name, wall in walls.items()
    }
    return budget.Run(tests, sum(t.wall for t in tests.values()), (0.0, 0.0))


BASE = {f"tests/a/test_x.py::test_{k}": 2.0 + k for k in range(10)} | {"tests/b/test_y.py::test_quick": 0.1}


@pytest.mark.parametrize("factor", [0.5, 1.0, 3.0])
def test_a_run_of_the_baseline_on_any_machine_is_within_the_budget(factor: float) -> None:
    problems, notes = budget.budget_problems(run_of(BASE, factor), BASE)
    assert problems == [] and notes[0] == f"machine factor {factor:.2f} (this run's seconds per baseline second)"


@pytest.mark.parametrize("factor", [0.5, 1.0, 3.0])
def test_new_tests_past_the_allowance_fail_on_any_machine(factor: float) -> None:
    within = BASE | {"tests/a/test_x.py::test_new": budget.NEW_TESTS_S - 1}
    assert budget.budget_problems(run_of(within, factor), BASE)[0] == []
    over = within | {"tests/a/test_x.py::test_newer": 2.0}
    (problem,) = budget.budget_problems(run_of(over, factor), BASE)[0]
    assert problem.startswith("the 2 new tests cost 61 s"), problem


def test_a_test_grown_past_twice_its_baseline_is_named_and_one_noisy_test_is_not() -> None:
    name = "tests/a/test_x.py::test_9"  # 11 s in the baseline
    noisy = run_of(BASE | {name: 2 * BASE[name] + budget.GROWTH_SLACK_S - 1}, factor=2.0)
    assert budget.budget_problems(noisy, BASE) == ([], ["machine factor 2.00 (this run's seconds per baseline second)"])
    grown = run_of(BASE | {name: 2 * BASE[name] + budget.GROWTH_SLACK_S + 1}, factor=2.0)
    problems, notes = budget.budget_problems(grown, BASE)
    assert problems == [] and name in notes[-1] and notes[-1].startswith("warning:")


def test_the_soak_counts_nothing() -> None:
    """CI runs the soak in `make test`'s session; it is bounded by its own timeout, not by the budget."""
    soak = "tests/a/test_x.py::test_chaos"
    assert budget.budget_problems(run_of(BASE | {soak: 400.0}, markers={soak: ["soak"]}), BASE)[0] == []
    assert budget.budget_problems(run_of(BASE | {soak: 400.0}, markers={soak: ["slow"]}), BASE)[0] != []


def test_failed_and_skipped_tests_count_nothing() -> None:
    run = run_of(BASE | {"tests/a/test_x.py::test_new": 500.0})
    run.tests["tests/a/test_x.py::test_new"] = budget.Test("tests/a/test_x.py::test_new", 500.0, 1.0, "failed", ())
    assert budget.budget_problems(run, BASE)[0] == []


def test_the_check_reads_what_the_plugin_writes(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    plugin = Timings(out)
    plugin.costs["tests/a/test_x.py::test_a"] = Cost("tests/a/test_x.py::test_a", markers=["slow"], wall=3.0, cpu=2.5)
    plugin.pytest_sessionfinish()
    run = budget.Run.read(out)
    (test,) = run.tests.values()
    assert (test.id, test.wall, test.cpu, test.slow, test.folder) == (
        "tests/a/test_x.py::test_a",
        3.0,
        2.5,
        True,
        "tests/a",
    )
    baseline = tmp_path / "baseline.json"
    budget.write_baseline(run, baseline)
    assert budget.main(["check", str(out), "--baseline", str(baseline)]) == 0
    assert budget.main(["check", str(tmp_path / "none.json"), "--baseline", str(baseline)]) == 2


def test_the_committed_baseline_is_within_the_suites_budgets() -> None:
    baseline = json.loads(budget.BASELINE.read_text())
    walls, slow, workers = baseline["tests"], set(baseline["slow"]), baseline["workers"]
    assert baseline["session_wall"] <= budget.SUITE_BUDGET_S, baseline["session_wall"]
    assert sum(wall for name, wall in walls.items() if name not in slow) / workers <= budget.FAST_BUDGET_S


@pytest.mark.slow
@pytest.mark.parametrize("workers", [[], ["-n", "2", "--dist", "loadfile"]], ids=["one process", "xdist"])
def test_every_test_is_recorded_with_its_cost_in_one_process_and_under_xdist(tmp_path: Path, workers) -> None:
    """`make test` runs under pytest-xdist: its workers measure, the controller writes one record per test,
    with what the tiers plugin saw (its teardown note) and the work of the test's own child process."""
    out = tmp_path / "run.json"
    result = run_project(tmp_path, *workers, "--tiers", "report", "--timings", str(out), plugins=("tiers", "timings"))
    assert result.returncode == 0, result.stdout + result.stderr
    records = {t.id.rsplit("::", 1)[1]: t for t in budget.Run.read(out).tests.values()}
    assert len(records) == 6 and {t.outcome for t in records.values()} == {"passed"}, records
    assert records["test_trains_marked"].markers == ("slow",)
    assert records["test_reads_a_listed_fixture"].markers == ("slow",)  # given by `slow_fixtures`
    for test in records.values():
        assert test.wall > 0 and test.cpu >= 0, test
    # The child's seconds count for the test that waited for it (RUSAGE_CHILDREN, in the worker).
    child = records["test_starts_a_process_unmarked"]
    assert child.cpu > records["test_quiet"].cpu, records
    raw = {t["id"].rsplit("::", 1)[1]: t for t in json.loads(out.read_text())["tests"]}
    assert raw["test_trains_unmarked"]["work"] == "trained (1 optimizer step(s))", raw
    assert raw["test_starts_a_process_unmarked"]["work"].startswith("started a process ("), raw
    assert raw["test_quiet"]["work"] == ""


def test_xdist_workers_get_the_longest_files_first_each_file_in_its_own_order() -> None:
    files = {"tests/a.py": 10.0, "tests/b.py": 300.0, "tests/c.py": 0.5}
    nodeids = ["tests/a.py::x", "tests/c.py::y", "tests/b.py::z", "tests/a.py::w", "tests/new.py::v", "tests/b.py::u"]
    order = [nodeids[i] for i in longest_first(nodeids, files)]
    assert order == [
        "tests/new.py::v",  # not in the baseline: may be long
        "tests/b.py::z",
        "tests/b.py::u",
        "tests/a.py::x",
        "tests/a.py::w",
        "tests/c.py::y",
    ]
    committed = seconds_per_file(json.loads(budget.BASELINE.read_text())["tests"])
    assert committed["tests/trainer/lifetime/test_elastic_trainer.py"] > committed["tests/test_timings.py"]


def test_a_file_with_a_test_the_baseline_lacks_goes_first() -> None:
    """A short file that holds a test the baseline does not know (the GPU check's rehearsal, which `make
    test` leaves to CI, in a file of one-second tests) may be long now: it goes before the longest known."""
    baseline = {"tests/long.py::a": 300.0, "tests/checks.py::quick": 1.0, "tests/short.py::b": 2.0}
    nodeids = ["tests/long.py::a", "tests/short.py::b", "tests/checks.py::quick", "tests/checks.py::rehearsal"]
    order = [nodeids[i] for i in longest_first(nodeids, seconds_per_file(baseline, nodeids))]
    assert order == ["tests/checks.py::quick", "tests/checks.py::rehearsal", "tests/long.py::a", "tests/short.py::b"]
    assert seconds_per_file(baseline) == {"tests/long.py": 300.0, "tests/checks.py": 1.0, "tests/short.py": 2.0}


def test_make_test_leaves_out_exactly_the_marks_the_budget_leaves_to_ci():
    """The Makefile's TEST_MARKS (which the mutation runner reads too) and timings.CI_ONLY_MARKS name the
    same tests: a mark added to one alone would make the budget count what `make test` never runs."""
    assert mutations.make_test_marks() == " and ".join(f"not {mark}" for mark in budget.CI_ONLY_MARKS)
