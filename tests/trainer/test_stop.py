"""stop.py, grace.py and the torchrun wrapper's pieces, without training: the signal rules in a real
process, the grace period's decision, the evaluation loop's agreement rounds, the pod's exit status."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time

import pytest
from maskrcnn_launcher.contract import EXIT_STOPPED, FORWARDED_STOP, STOP_SIGNALS, TERMINATION_GRACE_SECONDS

from maskrcnn_dist.data import eval_rounds
from maskrcnn_dist.errors import ConfigError
from maskrcnn_dist.evaluation import until_stopped
from maskrcnn_dist.lifetime.stop import Interrupted, Stopped, StopRequest, detach_pool_worker, stop_on_signals
from maskrcnn_dist.torchrun import child_pids, pod_exit_status, without_stop_signals
from maskrcnn_dist.training.grace import GraceCheck, grace_problem, grace_seconds

from .procs import REPO

# A process that installs a StopRequest, says when it is asked to stop, and then (argv[1] == "finish")
# marks its checkpoint written; it exits 0 after 20 s if nothing ends it first.
WAITER = """
import sys, time
from maskrcnn_dist.lifetime.stop import stop_on_signals
if sys.argv[1] == "late":  # still starting up when the test signals it
    time.sleep(1)
with stop_on_signals() as stop:
    print("ready", flush=True)
    deadline = time.monotonic() + 600  # ended by the test long before
    while not stop.requested and time.monotonic() < deadline:
        time.sleep(0.01)
    print("requested by", stop.reason, flush=True)
    if sys.argv[1] == "finish":
        stop.finish("saved")
    while time.monotonic() < deadline:
        time.sleep(0.01)
"""


class Waiter:
    def __init__(self, mode: str = "wait", blocked: set[int] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WAITER, mode],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            preexec_fn=(lambda: signal.pthread_sigmask(signal.SIG_BLOCK, blocked)) if blocked else None,
        )
        if mode != "late":
            self.wait_ready()

    def wait_ready(self) -> None:
        assert self.proc.stdout is not None and self.proc.stdout.readline() == "ready\n"

    def send(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def requested_by(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().removeprefix("requested by ").strip()

    def still_running_after(self, seconds: float) -> bool:
        time.sleep(seconds)
        return self.proc.poll() is None

    def exit_code(self, timeout: float = 120) -> int:  # a hang guard: it ends at once or not at all
        return self.proc.wait(timeout=timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate(timeout=10)


@pytest.fixture
def waiter():
    made: list[Waiter] = []

    def make(mode: str = "wait", blocked: set[int] | None = None) -> Waiter:
        made.append(Waiter(mode, blocked))
        return made[-1]

    yield make
    for w in made:
        w.close()


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_the_first_signal_asks_and_a_second_one_ends_the_process_by_that_signal(waiter, signum) -> None:
    w = waiter()
    w.send(signum)
    assert w.requested_by() == signal.Signals(signum).name
    assert w.still_running_after(0.3), "the first signal must only ask"
    w.send(signum)
    assert w.exit_code() == -signum  # the process ends by the signal itself: 128 + n in a shell
    assert f"second {signal.Signals(signum).name}" in w.proc.communicate()[1]


@pytest.mark.slow
def test_a_forwarded_stop_is_never_a_second_signal(waiter) -> None:
    """torchrun's forward (SIGUSR1) and a SIGTERM sent to every process reach a rank in either order."""
    w = waiter()
    w.send(signal.SIGUSR1)
    assert w.requested_by().startswith("SIGUSR1")
    w.send(signal.SIGUSR1)
    w.send(signal.SIGTERM)
    assert w.still_running_after(0.3)
    w.send(signal.SIGTERM)  # two direct ones: the second ends it
    assert w.exit_code() == -signal.SIGTERM


@pytest.mark.slow
def test_a_forward_sent_while_the_process_starts_waits_for_its_handler(waiter) -> None:
    """torchrun's ranks start with SIGUSR1 blocked (the wrapper's mask): a forward sent before a rank
    installed its handler is not lost, nor does it kill the rank (SIGUSR1's default action)."""
    w = waiter("late", blocked={signal.SIGUSR1})
    w.send(signal.SIGUSR1)  # during the start-up second, before install()
    w.wait_ready()
    assert w.requested_by().startswith("SIGUSR1")


@pytest.mark.slow
def test_once_the_checkpoint_is_written_any_signal_exits_stopped(waiter) -> None:
    w = waiter("finish")
    w.send(signal.SIGTERM)
    assert w.requested_by() == "SIGTERM"
    time.sleep(0.2)
    w.send(signal.SIGTERM)  # e.g. torchrun's agent ending the ranks as soon as one has exited
    assert w.exit_code() == EXIT_STOPPED


def test_the_request_keeps_its_first_reason_and_time() -> None:
    now = [10.0]
    stop = StopRequest(clock=lambda: now[0])
    assert not stop.requested and stop.seconds() == 0.0
    stop.request("SIGTERM")
    now[0] = 12.5
    stop.request("a stop on another rank")
    assert (stop.reason, stop.seconds()) == ("SIGTERM", 2.5)


def test_the_closing_line_says_what_continues_a_run_or_a_drained_member() -> None:
    """A stopped run goes on with --resume auto; a drained elastic member's run goes on without it, and the
    pod started again rejoins as a replacement (its --resume is not what continues anything)."""
    stop = StopRequest(clock=lambda: 0.0)
    stop.request("SIGTERM")
    stop.finish("checkpoint of step 4 written")
    assert Stopped(stop).closing_line().endswith("exit 75 (--resume auto continues)")
    drained = StopRequest(clock=lambda: 0.0)
    drained.request("SIGTERM")
    line = Stopped.left_group(drained, 4).closing_line()
    assert line.startswith("stopped by SIGTERM: left the elastic group after step 4;")
    assert "--resume" not in line and line.endswith("started again, this pod rejoins them at a step boundary)")


def test_the_request_takes_the_stop_signals_for_its_block_and_gives_them_back_unless_asked() -> None:
    previous = {signum: signal.getsignal(signum) for signum in (*STOP_SIGNALS, FORWARDED_STOP)}
    with stop_on_signals() as stop:
        for signum in previous:
            assert getattr(signal.getsignal(signum), "__self__", None) is stop
    assert {signum: signal.getsignal(signum) for signum in previous} == previous
    try:
        with stop_on_signals() as asked:
            asked.request("a test")
        # On its way out with exit 75: a late duplicate must not kill it.
        assert getattr(signal.getsignal(signal.SIGTERM), "__self__", None) is asked
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def test_a_data_check_worker_leaves_the_group_and_still_ends_with_its_pool() -> None:
    """The fork copies the trainer's stop handler: the worker must drop it, or the pool's terminate()
    (a SIGTERM) would leave it running and the trainer waiting for it."""
    with stop_on_signals():
        with multiprocessing.get_context("fork").Pool(1, initializer=detach_pool_worker) as pool:
            assert pool.apply(os.getpgrp) != os.getpgrp()  # a SIGTERM to the trainer's group misses it
            assert pool.apply(signal.getsignal, (signal.SIGTERM,)) == signal.SIG_DFL
            worker = pool.apply(os.getpid)
        with pytest.raises(ProcessLookupError):  # ended by terminate() (a SIGTERM) and reaped
            os.kill(worker, 0)


# -- the grace period --------------------------------------------------------------------------


def test_grace_problem_names_both_settings_and_a_value_that_fits() -> None:
    assert grace_problem(30, step_s=10, save_s=5) is None
    assert grace_problem(15, step_s=10, save_s=5) is None  # exactly enough
    problem = grace_problem(12, step_s=10, save_s=5)
    assert problem is not None
    assert "terminationGracePeriodSeconds" in problem and TERMINATION_GRACE_SECONDS in problem
    assert problem.endswith("at least 33")  # 15 s x 1.5 + 10 s for slower steps and leaving the group


def test_grace_seconds_from_the_environment() -> None:
    assert grace_seconds({}) is None
    assert grace_seconds({TERMINATION_GRACE_SECONDS: ""}) is None
    assert grace_seconds({TERMINATION_GRACE_SECONDS: "30"}) == 30.0
    for bad in ("soon", "-1", "nan", "inf"):
        with pytest.raises(ConfigError, match=TERMINATION_GRACE_SECONDS):
            grace_seconds({TERMINATION_GRACE_SECONDS: bad})


def test_the_grace_check_measures_once_on_the_second_step(caplog) -> None:
    caplog.set_level("INFO", logger="maskrcnn_dist.training.grace")
    saves: list[int] = []
    check = GraceCheck(5.0)
    for step in range(1, 5):
        check.after_step(4.0, lambda step=step: saves.append(step), last=False)
    assert saves == [2]
    assert [r.levelname for r in caplog.records] == ["INFO"]  # 4 s + a trial write of ~0 s fits in 5 s
    short = GraceCheck(1.0)
    short.after_step(4.0, lambda: saves.append(1), last=True)  # a one-step run measures its only step
    assert "terminationGracePeriodSeconds" in caplog.records[-1].message
    silent = GraceCheck(None)
    silent.after_step(4.0, lambda: saves.append(0), last=True)
    assert saves == [2, 1]


# -- evaluation's agreement rounds ----------------------------------------------------------------


class Agreeing:
    """An engine whose processes agree to stop at the `stop_at`-th check."""

    def __init__(self, stop_at: int | None) -> None:
        self.checks, self.stop_at = 0, stop_at

    def agree_to_stop(self) -> bool:
        self.checks += 1
        return self.checks == self.stop_at


def test_every_rank_checks_as_often_as_the_largest_shard_has_batches() -> None:
    assert eval_rounds(5, 2, world_size=2) == 2  # rank 0: 3 images, 2 batches; rank 1: 2 images, 1 batch
    assert eval_rounds(4, 2, world_size=2) == 1
    short_shard = Agreeing(None)
    assert list(until_stopped(["b0"], short_shard, rounds=2)) == ["b0"]
    assert short_shard.checks == 2  # once more without a batch: the peer's all-reduce is answered


def test_an_agreed_stop_interrupts_after_the_batch_in_progress() -> None:
    engine = Agreeing(stop_at=2)
    seen = []
    with pytest.raises(Interrupted):
        for batch in until_stopped(["b0", "b1", "b2"], engine, rounds=3):
            seen.append(batch)
    assert seen == ["b0", "b1"]


# -- the torchrun wrapper's pieces ----------------------------------------------------------------


def test_the_pod_exit_status_keeps_the_ranks_meaning() -> None:
    assert pod_exit_status([EXIT_STOPPED, EXIT_STOPPED]) == EXIT_STOPPED
    assert pod_exit_status([EXIT_STOPPED, -signal.SIGKILL]) == 1  # a rank that did not stop cleanly
    assert pod_exit_status([EXIT_STOPPED, 2]) == 2


def test_the_agent_keeps_only_the_signals_the_wrapper_does_not_take() -> None:
    assert without_stop_signals("SIGTERM,SIGINT,SIGHUP,SIGQUIT") == "SIGHUP,SIGQUIT"
    assert without_stop_signals("SIGUSR2") == "SIGUSR2"


@pytest.mark.slow
def test_child_pids_finds_this_process_s_children() -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert child.pid in child_pids(os.getpid())
    finally:
        child.kill()
        child.wait()
