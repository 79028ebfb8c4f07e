"""The JobSet scenarios: the chart rendered as a JobSet (workload jobset) and run by the emulated
JobSet and Job controllers (cluster/jobset.py): completion, a lost worker's group restart, fail-fast
on a user error (pipeline and ddp), and maxRestarts.
"""

from __future__ import annotations

import logging
import signal
import time
from typing import Any

from maskrcnn_launcher.boundary import EXIT_STOPPED

from .. import checks
from ..checks import Failed, require
from ..cluster import Attempt, DockerError, pvc_dir
from .chart import CPU_VALUES, DDP_CPU_OVERLAY, DDP_VALUES
from .common import RELEASE, WAIT_TIMEOUT, Settings, expected_checkpoints, trainer_args
from .deployment import Deployment

log = logging.getLogger("e2e")

# How long a finished JobSet is watched for anything starting again.
SETTLE_S = 15.0


def run_jobset(d: Deployment, timeout: float = 900) -> str:
    try:
        return d.jobset.run(timeout)
    except DockerError as exc:
        raise Failed(str(exc)) from exc


def check_finished_for_good(d: Deployment) -> dict[str, Any]:
    """A finished JobSet: no container runs, and for SETTLE_S seconds none is started or created."""
    created, attempts = len(d.cluster.containers), len(d.jobset.attempts)
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline:
        d.jobset.reconcile()
        running = [c for c in d.cluster.containers if d.cluster.state(c).status in ("running", "restarting")]
        require(not running, f"after the JobSet {d.jobset.terminal_state}: still running {running}")
        time.sleep(1.0)
    require(len(d.cluster.containers) == created and len(d.jobset.attempts) == attempts, "a pod was created again")
    pods = [p for j in d.jobset.attempt.jobs for p in j.pods]
    return {p.spec.host: p.exit_code for p in pods}


def jobset_facts(d: Deployment, started: float) -> dict[str, Any]:
    condition = d.jobset.condition
    return {
        "jobset": {"state": condition.type, "reason": condition.reason, "restarts": d.jobset.restarts},
        "seconds": round(time.monotonic() - started, 1),
    }


def scenario_jobset(settings: Settings) -> dict[str, Any]:
    """JobSet (ci/cpu-values.yaml as workload jobset, controller emulated): a short run completes; the
    master's Job completing completes the JobSet, every other pod is stopped, nothing restarts."""
    steps, period = 4, 2
    with Deployment(settings, "jobset") as d:
        started = time.monotonic()
        js = d.render_jobset(CPU_VALUES, {"trainer": {"args": trainer_args(steps, period)}})
        hosts = sorted(p.host for p in js.pod_specs())
        expected = [f"{RELEASE}-maskrcnn-dist-{h}" for h in ("master-0-0", "workers-0-0", "workers-0-1")]
        require(hosts == expected, f"JobSet host names {hosts}, expected {expected}")
        state = run_jobset(d)
        require(state == "Completed", f"the JobSet ended {state}: {js.condition} ({js.describe()})")
        require(js.restarts == 0, f"{js.restarts} restarts in a run without faults")
        exits = check_finished_for_good(d)
        require(exits[f"{RELEASE}-maskrcnn-dist-master-0-0"] == 0, f"the master exited {exits}")
        final = checks.check_training_complete(d.run_dir, steps)
        ckpts = checks.check_checkpoints(d.run_dir, expected_steps=[2, 4])
        for pod in js.pods("workers"):
            require(d.log_has(pod.container, r"accepts connections"), f"{pod.spec.host}: never reached the master")
        return {
            **jobset_facts(d, started),
            "exit_codes": exits,
            "eval": {k: final[k] for k in checks.AP_KEYS},
            "checkpoints": ckpts,
        }


def scenario_jobset_lost_worker(settings: Settings) -> dict[str, Any]:
    """JobSet: worker 2's pod killed mid-training; its Job fails, the JobSet recreates the whole group
    once (restarts 1, under maxRestarts), the new group resumes from the newest checkpoint and completes."""
    period = 3
    steps = 2 * period + 1
    with Deployment(settings, "jobset-lost-worker") as d:
        started = time.monotonic()
        resumes: list[dict[str, float]] = []
        js = d.render_jobset(CPU_VALUES, {"trainer": {"args": trainer_args(steps, period)}})

        def note_resume(attempt: Attempt) -> None:
            # The old group is gone (BlockingRecreate): what it left is what the new one resumes from.
            if attempt.number > 0:
                newest = max(checks.checkpoint_steps(d.run_dir), default=0)
                resumes.append({"since": time.time(), "checkpoint": newest})

        js.on_attempt = note_resume

        def past_first_checkpoint() -> bool:
            require(js.reconcile() is None, f"the JobSet ended {js.condition} before the fault")
            return checks.last_train_step(d.run_dir) > period

        d.wait_until(f"training past step {period}", past_first_checkpoint, 600)
        victim = js.pods("workers")[-1]
        at_kill = checks.last_train_step(d.run_dir)
        d.cluster.kill(victim.container)
        log.info("%s: killed %s at step %d", d.name, victim.spec.host, at_kill)
        state = run_jobset(d)
        require(state == "Completed", f"the JobSet ended {state}: {js.condition} ({js.describe()})")
        require(js.restarts == 1 and len(resumes) == 1, f"{js.restarts} restarts, expected 1 ({js.events})")
        check_finished_for_good(d)
        resumed = checks.train_steps(checks.records_since(d.run_dir, resumes[0]["since"]))
        resume_from = resumes[0]["checkpoint"]
        require(
            resumed == list(range(resume_from + 1, steps + 1)),
            f"after the restart training ran steps {resumed}, expected {resume_from + 1}..{steps} "
            f"(the newest checkpoint was step {resume_from})",
        )
        checks.check_training_complete(d.run_dir, steps)
        ckpts = checks.check_checkpoints(d.run_dir, expected_steps=expected_checkpoints(steps, period, 4))
        failed_job = next(e for e in js.events if "failed (" in e)
        return {
            **jobset_facts(d, started),
            "killed": victim.spec.host,
            "killed_at_step": at_kill,
            "failed_job": failed_job,
            "resumed_from_checkpoint": resume_from,
            "checkpoints": ckpts,
        }


def scenario_jobset_user_error(settings: Settings) -> dict[str, Any]:
    """JobSet: a bad dataset (an annotation file that is not JSON) makes the master exit 2; the
    podFailurePolicy and the JobSet's failure policy fail the JobSet at once: no restart, the error
    line in the master's log, every pod stopped."""
    with Deployment(settings, "jobset-user-error") as d:
        started = time.monotonic()
        args = trainer_args(4, 2, synthetic=False)
        args[args.index("--data-path") + 1] = "/data/broken"
        js = d.render_jobset(CPU_VALUES, {"trainer": {"args": args}}, start=False)
        # The broken dataset on the claim the master mounts, before its pod starts.
        master = next(r.pod_template["spec"] for r in js.spec.replicated_jobs if r.name == "master")
        claim = next(v["persistentVolumeClaim"]["claimName"] for v in master["volumes"] if "persistentVolumeClaim" in v)
        broken = pvc_dir(d.cluster.host_dir, claim, master["securityContext"]["fsGroup"]) / "broken" / "train"
        (broken / "images").mkdir(parents=True)
        (broken / "annotations.json").write_text('{"images": [{"id": 1, ')
        for path in (broken.parent, broken, broken / "images"):
            path.chmod(0o755)
        js.start()
        return _failed_at_once(d, started, "not valid JSON")


def scenario_jobset_user_error_ddp(settings: Settings) -> dict[str, Any]:
    """JobSet, ddp (torchrun in each pod): a --data-path that does not exist makes every rank exit 2;
    torchrun alone would exit 1 (and the group would be retried up to maxRestarts), the trainer's
    torchrun wrapper keeps the 2, so the JobSet fails at once as for the pipeline."""
    with Deployment(settings, "jobset-user-error-ddp") as d:
        started = time.monotonic()
        args = trainer_args(4, 2, synthetic=False)
        args[args.index("--data-path") + 1] = "/data/missing"
        d.render_jobset(DDP_VALUES, {**DDP_CPU_OVERLAY, "trainer": {"args": args}})
        return _failed_at_once(d, started, "/data/missing")


def _failed_at_once(d: Deployment, started: float, error_text: str) -> dict[str, Any]:
    """A user error: the JobSet fails through its UserError rule without a restart, on a pod that exited
    2 with an `error: ...` line holding `error_text`, and nothing runs afterwards. Under ddp every rank
    meets the error: whichever exits first fails the JobSet, the others exit 2 too or are stopped."""
    js = d.jobset
    assert js is not None, "render_jobset first"
    state = run_jobset(d, timeout=300)
    require(state == "Failed", f"the JobSet ended {state}: {js.condition}")
    require(js.condition.reason == "FailJobSetFailurePolicyAction", f"failed for {js.condition}")
    require(js.restarts == 0 and len(js.attempts) == 1, f"a user error was retried: {js.events}")
    culprit = js.acted_on.failed_by
    host = culprit.spec.host
    require(culprit.exit_code == 2, f"the JobSet failed on {host}, which exited {culprit.exit_code}, expected 2")
    line = next((ln for ln in d.cluster.logs(culprit.container).splitlines() if ln.startswith("error: ")), None)
    require(line is not None and error_text in line, f"no 'error: ... {error_text}' line in {host}'s log")
    exits = check_finished_for_good(d)
    # Stopped: by the kit's SIGTERM handler, or by SIGTERM itself in a pod not yet past its start.
    stopped = (EXIT_STOPPED, 128 + signal.SIGTERM)
    others = {h: code for h, code in exits.items() if h != host and code != 2 and code not in stopped}
    require(not others, f"after {host}'s user error, pods exited {others}: neither 2 nor stopped {stopped}")
    facts = {"failed_on": host, "message": js.condition.message, "error_line": line, "exit_codes": exits}
    return {**jobset_facts(d, started), **facts}


def scenario_jobset_max_restarts(settings: Settings) -> dict[str, Any]:
    """JobSet with maxRestarts 2 whose trainer always crashes (exit 1, not a user error): the group is
    recreated twice, the third failure fails the JobSet (ReachedMaxRestarts); nothing runs after."""
    crash = "sh -c 'echo \"trainer crashed (injected)\" >&2; exit 1'"
    env = [
        {"name": "MASKRCNN_WAIT_TIMEOUT", "value": str(WAIT_TIMEOUT)},
        {"name": "MASKRCNN_TRAINER_CMD", "value": crash},
    ]
    with Deployment(settings, "jobset-max-restarts") as d:
        started = time.monotonic()
        policy = {"failurePolicy": {"maxRestarts": 2}}
        js = d.render_jobset(CPU_VALUES, {"jobset": policy, "extraEnv": env, "trainer": {"args": trainer_args(4, 2)}})
        state = run_jobset(d, timeout=300)
        require(state == "Failed", f"the JobSet ended {state}: {js.condition}")
        require(js.condition.reason == "ReachedMaxRestarts", f"failed for {js.condition}")
        require(js.restarts == 2 and len(js.attempts) == 3, f"{js.restarts} restarts, {len(js.attempts)} attempts")
        for attempt in js.attempts:
            (master_job,) = [j for j in attempt.jobs if j.replicated_job == "master"]
            require(master_job.reason == "BackoffLimitExceeded", f"attempt {attempt.number}: {master_job}")
        check_finished_for_good(d)
        return {**jobset_facts(d, started), "message": js.condition.message, "events": js.events}
