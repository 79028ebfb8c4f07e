"""`make gpu-check` (checks/gpu) on CPU: every check passes or says why it is skipped, a failing check is
recorded while the run goes on, and the JSON report holds every check. Keeps the GPU check from rotting
between GPU sessions (it runs the same code, with the small model on tiny images). The three tests
of the whole run are marked `rehearsal`: `make gpu-check-cpu` and .ci/run run them, `make test` does not
(each path it takes is the kit's own, which make test's engine tests cover; the run is 2-3 minutes)."""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from checks.gpu import __main__ as gpu_check
from checks.gpu import harness
from checks.gpu.catalog import CHECKS, INJECTED, INJECTED_HANG

# The checks' budgets are set for a GPU lease; here each is a hang guard only, BUDGET_SCALE times its
# own (a check takes a third of its budget or less on a quiet 2-core machine), so that a loaded machine
# cannot decide the verdict: a check that still runs past it is reported as a timeout.
BUDGET_SCALE = 10


@dataclass(frozen=True)
class SelfTest:
    code: int
    work: Path
    checks: dict[str, dict[str, Any]]  # name -> the JSON report's entry
    order: list[str]


@pytest.fixture(scope="module")
def gpu_self_test(tmp_path_factory: pytest.TempPathFactory) -> SelfTest:
    """`python -m checks.gpu --device cpu --inject-failure` once; the tests below read its report."""
    tmp = tmp_path_factory.mktemp("gpu-check")
    report_file = tmp / "report.json"
    work = ["--work-dir", str(tmp / "work"), "--time-budget", "3600", "--budget-scale", str(BUDGET_SCALE)]
    code = gpu_check.main(["--device", "cpu", "--inject-failure", *work, "--json-out", str(report_file)])
    report = json.loads(report_file.read_text())
    left = processes_mentioning(str(tmp))
    assert left == [], f"the self-test left processes: {left}"
    checks = {c["name"]: c for c in report["checks"]}
    return SelfTest(code, tmp / "work", checks, [c["name"] for c in report["checks"]])


@pytest.mark.slow
@pytest.mark.rehearsal
@pytest.mark.timeout(4000)
def test_cpu_self_test_runs_every_check_in_order(gpu_self_test: SelfTest) -> None:
    injected = (INJECTED, INJECTED_HANG)
    assert [name for name in gpu_self_test.order if name not in injected] == [c.name for c in CHECKS]
    assert {c["result"] for c in gpu_self_test.checks.values()} <= set(harness.RESULTS)
    problems = {n: c["reason"] for n, c in gpu_self_test.checks.items() if c["result"] != "pass" and not c["reason"]}
    assert not problems, problems  # a skip or a failure always says why
    assert gpu_self_test.checks["pipeline_replicas"]["reason"].startswith("needs 2 GPUs")


@pytest.mark.slow
@pytest.mark.rehearsal
@pytest.mark.timeout(4000)
def test_injected_failure_and_hang_are_recorded_and_the_run_goes_on(gpu_self_test: SelfTest) -> None:
    """The injected hang holds a process tree of its own: the runner ends the check at its budget,
    records why, and the tree is gone too (the check's process cleans up on SIGTERM; the fixture finds
    no process naming the work folder). The checks after the two still ran (the test above)."""
    raised, hung = gpu_self_test.checks[INJECTED], gpu_self_test.checks[INJECTED_HANG]
    assert raised["result"] == "fail" and "injected failure" in raised["reason"], raised
    # Its budget: twice the seconds the injected failure took (catalog.py), at least harness.MIN_BUDGET_S.
    budget = max(harness.MIN_BUDGET_S, round(2 * raised["seconds"]))
    assert (hung["result"], hung["reason"]) == ("fail", f"timed out after its budget of {budget:.0f} s"), hung
    assert (gpu_self_test.work / "injected-hang.log").is_file()  # the sleeper had started
    assert gpu_self_test.code == 1


@pytest.mark.slow
@pytest.mark.rehearsal
@pytest.mark.timeout(4000)
def test_every_check_that_runs_on_cpu_passes_with_its_figures(gpu_self_test: SelfTest) -> None:
    checks = {n: c for n, c in gpu_self_test.checks.items() if n not in (INJECTED, INJECTED_HANG)}
    timed_out = {name: c["reason"] for name, c in checks.items() if c["reason"].startswith("timed out")}
    assert not timed_out, f"the hang guard ({BUDGET_SCALE}x each check's budget) ended {timed_out}"
    failed = {name: c["reason"] for name, c in checks.items() if c["result"] == "fail"}
    assert not failed, failed
    # What runs on CPU ran (the rest needs CUDA or 2 GPUs), with its figures.
    ran = {name for name, c in checks.items() if c["result"] == "pass"}
    assert ran == {
        "throughput",
        "amp_bf16",
        "pipeline_amp",
        "pipeline_cpu",
        "ddp",
        "ddp_elastic",
        "eval_amp",
        "checkpoint_devices",
    }, checks
    assert checks["checkpoint_devices"]["figures"]["cpu_to_cpu_loss"] > 0
    assert checks["ddp"]["figures"]["backend"] == "gloo"
    elastic = checks["ddp_elastic"]["figures"]
    assert elastic["pods"] == 3 and elastic["world_sizes"][-1] == 2 and elastic["same_weights"], elastic
    # On CPU, one thread each, the pipeline computes what the local engine computes, bit for bit, in fp32
    # and in bf16: a stage that skipped its one optimizer step would still be within the check's floors.
    pipeline = checks["pipeline_cpu"]["figures"]
    assert pipeline["loss"] == pipeline["weights"] == 0, pipeline
    stages = checks["pipeline_amp"]["figures"]
    assert list(stages) == ["bfloat16", "headline"], stages
    assert stages["bfloat16"]["max_rel_loss_diff"] == stages["bfloat16"]["weights_max_abs_diff"] == 0, stages
    throughput = {r["variant"]: r for r in checks["throughput"]["figures"]["results"]}
    assert throughput["tv_amp_bf16"]["images_per_s"] > 0 and throughput["kit_amp_bf16"]["images_per_s"] > 0, throughput
    # The batched heads wait a few times a step, torchvision's image by image (modeling/waits.py).
    assert throughput["kit_amp_bf16"]["waits"] < throughput["kit_amp_bf16_tvheads"]["waits"], throughput
    amp = checks["amp_bf16"]["figures"]
    assert amp["batches"] == harness.PROFILES["cpu"].amp_batches >= 2, amp  # the second at trained weights
    assert set(amp["floor"]) == {"loss", "backbone", "rpn", "heads"}, amp
    assert min(amp["worst_ratio_to_floor"].values()) > 0, amp  # autocast moved every group: bf16 was on


def test_skips_say_why_and_a_spent_budget_skips_the_rest(tmp_path: Path) -> None:
    """The runner decides skips before starting a process."""
    env = harness.Env(device="cpu", gpus=0, work=str(tmp_path))
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"device": "cpu", "gpus": 0, "work": str(tmp_path)}))
    skipped = harness.run_check(
        next(c for c in CHECKS if c.name == "amp_fp16"), env, plan, budget_s=60
    )  # local_amp_fp16: needs CUDA
    assert (skipped.result, skipped.reason) == ("skipped", "needs CUDA (--device cpu)")
    late = harness.run_check(CHECKS[0], env, plan, budget_s=1)
    assert (late.result, late.reason) == ("skipped", "out of time: the run's time budget is spent")


def processes_mentioning(text: str) -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in words:
            found.append(words)
    return found


def test_the_elastic_check_needs_a_gpu_per_rank_on_cuda() -> None:
    from checks.gpu.elastic import needs_elastic_devices

    def env(device: str, gpus: int) -> harness.Env:
        return harness.Env(device=device, gpus=gpus, work="/nonexistent")

    assert needs_elastic_devices(env("cuda", 1)) == "needs 2 GPUs: NCCL refuses two ranks on one device (1 here)"
    assert needs_elastic_devices(env("cuda", 2)) is None and needs_elastic_devices(env("cpu", 0)) is None


def test_the_runner_puts_back_the_sigterm_handler_it_installs(tmp_path: Path) -> None:
    """main() unwinds on SIGTERM while it runs; called as a library (the self-test above, in a pytest
    worker) it leaves the process's handler as it found it: left, a later SIGTERM to a fork of the worker
    (the data check's readers) ran it there and unwound the fork into pytest's own loop."""
    before = signal.getsignal(signal.SIGTERM)
    argv = ["--device", "cpu", "--only", "no_such_check", "--work-dir", str(tmp_path / "work")]
    assert gpu_check.main([*argv, "--json-out", str(tmp_path / "report.json")]) == 2  # refused: unknown check
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_work_dir_an_earlier_run_left_is_refused_in_one_line(tmp_path: Path, capsys) -> None:
    """A second run in the same --work-dir would resume the first one's checkpoints: refused before any check."""
    (tmp_path / "data").mkdir()
    with pytest.raises(SystemExit) as ended:
        gpu_check.main(["--device", "cpu", "--work-dir", str(tmp_path), "--json-out", str(tmp_path / "r.json")])
    assert ended.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.endswith(f"--work-dir {tmp_path}: not empty (an earlier run's?); give a new or an empty folder")
    assert not (tmp_path / "r.json").exists()


def test_a_work_dir_that_is_a_file_is_refused_in_one_line(tmp_path: Path, capsys) -> None:
    (tmp_path / "work").write_text("")
    with pytest.raises(SystemExit) as ended:
        gpu_check.main(["--device", "cpu", "--work-dir", str(tmp_path / "work")])
    assert ended.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(f"--work-dir {tmp_path / 'work'}: not a folder")
