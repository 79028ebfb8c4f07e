"""The preemption scenarios: a pod is taken away the way Kubernetes does it (SIGTERM, then SIGKILL after
the pod's terminationGracePeriodSeconds: `docker stop --time`) in the middle of an epoch.

Every pod stops at the same step boundary: the master writes a checkpoint of that step, and every pod
exits EXIT_STOPPED within the grace period. The restarted group trains the next step, so no finished
step is lost and none is done twice (pipeline and ddp, as StatefulSets). As a JobSet with maxRestarts
0, a worker the emulated controller marks with DisruptionTarget (as a preemption does) restarts the
group without counting and the job completes, while a crash under the same JobSet fails it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from maskrcnn_launcher.boundary import EXIT_STOPPED

from .. import checks
from ..checks import Failed, require
from ..cluster import Attempt, DockerError
from .chart import CPU_VALUES, DDP_CPU_OVERLAY, DDP_VALUES
from .common import Settings, trainer_args
from .deployment import Deployment
from .jobset import check_finished_for_good, jobset_facts, run_jobset

log = logging.getLogger("e2e")

GRACE_S = 60  # the chart's terminationGracePeriodSeconds
STEPS, PER_EPOCH = 10, 4  # 8 images at batch 2 (pipeline), 16 at batch 2 on each of two ddp ranks
# Checkpoints the plan writes itself: epoch ends and the last step (--checkpoint-period 0).
PLANNED_CHECKPOINTS = [4, 8, 10]


def _wait_mid_epoch(d: Deployment, alive: Callable[[], None] | None = None) -> int:
    """Wait until training is inside an epoch (not at its last step) with room left; that step."""

    def mid_epoch() -> bool:
        if alive is not None:
            alive()
        step = checks.last_train_step(d.run_dir)
        return step > PER_EPOCH and step % PER_EPOCH != 0 and step < STEPS - 2

    d.wait_until("training in the middle of its second epoch", mid_epoch, 600, poll=0.2)
    return checks.last_train_step(d.run_dir)


def _exit_seconds(d: Deployment, names: list[str], since: float) -> dict[str, float]:
    """Seconds from `since` (time.time()) to each container's exit."""
    epoch = datetime.fromtimestamp(since, timezone.utc)
    return {n: round((d.cluster.state(n).finished_time - epoch).total_seconds(), 1) for n in names}


def _stop_one(d: Deployment, victim: str) -> dict[str, Any]:
    """SIGTERM one pod with the grace period; every pod must exit EXIT_STOPPED within it, the newest
    checkpoint being the last step trained, with nothing half written and no traceback."""
    at_signal = _wait_mid_epoch(d)
    sent = time.time()
    d.cluster.stop([victim], grace=GRACE_S)
    try:
        states = d.cluster.wait_exit(d.all, timeout=GRACE_S)
    except DockerError as exc:
        raise Failed(f"after SIGTERM to {victim}: {exc}") from exc
    seconds = _exit_seconds(d, d.all, sent)
    codes = {n: s.exit_code for n, s in states.items()}
    require(
        all(c == EXIT_STOPPED for c in codes.values()), f"exit codes {codes}, expected {EXIT_STOPPED} from every pod"
    )
    require(max(seconds.values()) < GRACE_S, f"seconds from SIGTERM to exit {seconds}: over the grace period {GRACE_S}")
    stopped_at = checks.last_train_step(d.run_dir)
    newest = max(checks.checkpoint_steps(d.run_dir), default=0)
    require(newest == stopped_at, f"trained up to step {stopped_at}, the newest checkpoint is step {newest}")
    require(at_signal <= stopped_at < STEPS, f"SIGTERM after step {at_signal}, stopped at step {stopped_at}")
    checks.check_checkpoints(d.run_dir)  # every one loads, no temporary file left
    for name in d.all:
        require("Traceback" not in d.cluster.logs(name), f"{name}: a traceback in its log")
    short = {n.split("maskrcnn-dist-")[-1]: s for n, s in seconds.items()}
    return {"sigterm_after_step": at_signal, "stopped_at_step": stopped_at, "exit_seconds": short}


def _restart_and_finish(d: Deployment, stopped_at: int) -> dict[str, Any]:
    """Every pod restarted (restartPolicy Always): training goes on at the next step, redoes none,
    and finishes the plan with one train record per step."""
    restarted_at = time.time()
    d.cluster.start(*d.workers, d.master)
    d.wait_success(timeout=600)
    resumed = checks.train_steps(checks.records_since(d.run_dir, restarted_at))
    require(
        resumed == list(range(stopped_at + 1, STEPS + 1)),
        f"after the restart training ran steps {resumed}, expected {stopped_at + 1}..{STEPS}",
    )
    checks.check_one_train_record_per_step(d.run_dir, STEPS)
    checks.check_training_complete(d.run_dir, STEPS)
    ckpts = checks.check_checkpoints(d.run_dir)
    require(set(PLANNED_CHECKPOINTS) | {stopped_at} == set(ckpts), f"checkpoints {ckpts}")
    return {"resumed_at_step": resumed[0], "steps_redone": 0, "checkpoints": ckpts}


def _preempt(settings: Settings, name: str, ddp: bool) -> dict[str, Any]:
    with Deployment(settings, name) as d:
        args = trainer_args(STEPS, 0, synthetic=not ddp)
        if ddp:
            d.render(DDP_VALUES, {**DDP_CPU_OVERLAY, "trainer": {"args": args}})
            d.prepare_dataset(train_images=16)
        else:
            d.render(CPU_VALUES, {"trainer": {"args": args}})
        d.cluster.start(*d.all)
        victim = d.workers[-1]
        stop = _stop_one(d, victim)
        log.info("%s: %s stopped after step %d: %s", name, victim, stop["stopped_at_step"], stop["exit_seconds"])
        return {"planned_steps": STEPS, "stopped": victim, **stop, **_restart_and_finish(d, stop["stopped_at_step"])}


def scenario_preempt_pipeline(settings: Settings) -> dict[str, Any]:
    """Pipeline: worker 2 (stage 2) gets SIGTERM mid-epoch (docker stop, 60 s grace): every pod exits
    75 within the grace period, the newest checkpoint is the step they stopped at, the restarted group
    trains the next step, and metrics.jsonl has one train record per planned step."""
    return _preempt(settings, "preempt-pipeline", ddp=False)


def scenario_preempt_ddp(settings: Settings) -> dict[str, Any]:
    """The same under ddp (torchrun in each pod): the worker pod gets SIGTERM, both ranks stop at the
    same step, rank 0 writes its checkpoint, both pods exit 75; restart, next step, one record each."""
    return _preempt(settings, "preempt-ddp", ddp=True)


# -- the JobSet's rules ------------------------------------------------------------------------

NO_RESTARTS = {"jobset": {"failurePolicy": {"maxRestarts": 0}}}


def _disrupted(settings: Settings) -> dict[str, Any]:
    """maxRestarts 0, a worker preempted mid-epoch: restarted without counting, completed, no step redone."""
    with Deployment(settings, "jobset-disruption") as d:
        started, resumes = time.monotonic(), []
        js = d.render_jobset(CPU_VALUES, {**NO_RESTARTS, "trainer": {"args": trainer_args(STEPS, 0)}})
        deployment_hook = js.on_attempt

        def note_resume(attempt: Attempt) -> None:
            deployment_hook(attempt)
            resumes.append((time.time(), max(checks.checkpoint_steps(d.run_dir), default=0)))

        js.on_attempt = note_resume

        def alive() -> None:
            require(js.reconcile() is None, f"the JobSet ended {js.condition} before the disruption")

        at_signal = _wait_mid_epoch(d, alive)
        victim = js.pods("workers")[-1]
        js.delete_pod(victim, disruption="PreemptionByScheduler")
        require(victim.exit_code == EXIT_STOPPED, f"the preempted worker exited {victim.exit_code}")
        state = run_jobset(d)
        require(state == "Completed", f"the JobSet ended {state}: {js.condition} ({js.describe()})")
        require((js.restarts, js.restarts_count_towards_max) == (1, 0), f"restarts {js.status()}: {js.events}")
        check_finished_for_good(d)
        since, resume_from = resumes[-1]
        resumed = checks.train_steps(checks.records_since(d.run_dir, since))
        require(resumed == list(range(resume_from + 1, STEPS + 1)), f"resumed at {resumed}, checkpoint {resume_from}")
        require(resume_from >= at_signal, f"SIGTERM after step {at_signal}, resumed from step {resume_from}")
        checks.check_one_train_record_per_step(d.run_dir, STEPS)
        rule = next(e for e in js.events if e.startswith("failure policy rule"))
        return {**jobset_facts(d, started), "sigterm_after_step": at_signal, "resumed_from": resume_from, "rule": rule}


def _crashed(settings: Settings) -> dict[str, Any]:
    """The same JobSet, a worker killed (SIGKILL, no DisruptionTarget): it fails, ReachedMaxRestarts."""
    with Deployment(settings, "jobset-disruption-crash") as d:
        started = time.monotonic()
        js = d.render_jobset(CPU_VALUES, {**NO_RESTARTS, "trainer": {"args": trainer_args(STEPS, 0)}})
        d.wait_until(
            "training under way", lambda: js.reconcile() is None and checks.last_train_step(d.run_dir) > 1, 600
        )
        d.cluster.kill(js.pods("workers")[-1].container)
        state = run_jobset(d, timeout=300)
        require(state == "Failed", f"the JobSet ended {state}: {js.condition}")
        require(js.condition.reason == "ReachedMaxRestarts" and js.restarts == 0, f"{js.condition}, {js.events}")
        check_finished_for_good(d)
        return {**jobset_facts(d, started), "message": js.condition.message}


def scenario_jobset_disruption(settings: Settings) -> dict[str, Any]:
    """JobSet, maxRestarts 0: a worker marked DisruptionTarget (PreemptionByScheduler) and stopped with
    its grace period exits 75; the group restarts without counting (restartsCountTowardsMax 0) and the
    JobSet completes, no step redone. Then the same JobSet with a worker killed (a crash): Failed."""
    return {"disrupted": _disrupted(settings), "crashed": _crashed(settings)}
