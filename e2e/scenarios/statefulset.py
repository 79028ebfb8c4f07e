"""The StatefulSet scenarios: the chart's default workload, each pod a container that the scenario
starts, watches, faults and restarts (as the kubelet and the StatefulSet controller would).

pipeline and ddp training, the workers' wait for a late master, the pods' security posture, and
fault recovery: a killed worker or master, a frozen peer, a lone container restart under the
kubelet's back-off, a killed ddp worker.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from .. import checks
from ..checks import Failed, require
from ..cluster import DockerError, Kubelet, PodSpec, quantity_bytes
from .chart import CPU_VALUES, DDP_CPU_OVERLAY, DDP_VALUES
from .common import EXIT_MARGIN, RELEASE, RPC_TIMEOUT, Settings, expected_checkpoints, trainer_args
from .deployment import Deployment

log = logging.getLogger("e2e")


POSTURE_PROBE = r"""
echo "user $(id -u)"; echo "groups $(id -G)"
grep -E '^(NoNewPrivs|CapEff):' /proc/self/status | tr -s '\t ' ' '
touch /opt/probe 2>/dev/null && echo root-writable || echo root-read-only
touch /tmp/probe && echo tmp-writable
touch "$HOME/probe" && echo home-writable
df -k /dev/shm | awk 'NR==2 {print "shm-kb", $2}'
test -r "$MASKRCNN_TOPOLOGY" && ! touch "$MASKRCNN_TOPOLOGY" 2>/dev/null && echo topology-read-only
"""


def check_posture(d: Deployment, container: str, pod: PodSpec) -> dict[str, Any]:
    """Inside a running pod container: the user, no capabilities, no-new-privileges, a read-only
    root with writable scratch emptyDirs, /dev/shm at the pod's size, the topology mounted read-only."""
    out = d.cluster.exec(container, "sh", "-c", POSTURE_PROBE, timeout=60).splitlines()
    shm = next(m.size_limit for m in pod.mounts if m.path == "/dev/shm")
    expected = {
        f"user {pod.run_as_user}",
        "NoNewPrivs: 1",
        "CapEff: 0000000000000000",
        "root-read-only",
        "tmp-writable",
        "home-writable",
        f"shm-kb {quantity_bytes(shm) // 1024}",
        "topology-read-only",
    }
    missing = expected - {line.strip() for line in out}
    require(not missing, f"{container}: the posture probe lacks {sorted(missing)}; it said {out}")
    groups = next(line for line in out if line.startswith("groups ")).split()[1:]
    require(str(pod.fs_group) in groups, f"{container}: groups {groups} lack fsGroup {pod.fs_group}")
    return {"probe": out}


def scenario_pipeline(settings: Settings) -> dict[str, Any]:
    """Pipeline over three pods (ci/cpu-values.yaml): the workers start 30 s before the master and
    wait; short schedule, evaluation, checkpoints + metrics on the shared volume. Then the finished
    pods are started again, as restartPolicy Always does: they exit 0 and train nothing more."""
    steps, period = 6, 2
    with Deployment(settings, "pipeline") as d:
        d.render(CPU_VALUES, {"trainer": {"args": trainer_args(steps, period)}})
        d.cluster.start(*d.workers)
        early = time.monotonic()
        # Each worker says it waits (however long a loaded machine takes to start it), and 30 s after
        # their start none has given up: no verdict here depends on how fast the containers start.
        waiting = r"waiting for master \S+ to resolve"
        d.wait_until("the workers' waiting line", lambda: all(d.log_has(w, waiting) for w in d.workers), 120)
        time.sleep(max(0.0, 30 - (time.monotonic() - early)))
        for w in d.workers:
            require(d.cluster.state(w).running, f"{w} did not wait for the master: {d.cluster.state(w)}")
        posture = check_posture(d, d.workers[0], d.release.workers[0])
        d.cluster.start(d.master)
        started = time.monotonic()
        d.wait_success(timeout=600)
        train_s = time.monotonic() - started
        final = checks.check_training_complete(d.run_dir, steps)
        ckpts = checks.check_checkpoints(d.run_dir, expected_steps=[2, 4, 6])
        for w in d.workers:
            require(d.log_has(w, r"accepts connections"), f"{w}: never reached the master's port")
        # A finished group restarted (restartPolicy Always): resume finds the plan done.
        restarted_at = time.time()
        d.cluster.start(*d.workers, d.master)
        d.wait_success(timeout=300)
        new = [r for r in checks.records_since(d.run_dir, restarted_at) if r.get("kind") in ("train", "eval")]
        require(not new, f"restarting the finished job trained or evaluated again: {new[:3]}")
        require(checks.checkpoint_steps(d.run_dir) == ckpts, "restarting the finished job wrote checkpoints")
        return {
            "train_seconds": round(train_s, 1),
            "eval": {k: final[k] for k in checks.AP_KEYS},
            "checkpoints": ckpts,
            "posture": posture,
        }


def scenario_ddp(settings: Settings) -> dict[str, Any]:
    """ddp over two pods (ci/ddp-values.yaml on CPU): torchrun in each, gloo, dataset prepared on the volume."""
    steps, period = 4, 2
    with Deployment(settings, "ddp") as d:
        d.render(DDP_VALUES, {**DDP_CPU_OVERLAY, "trainer": {"args": trainer_args(steps, period, synthetic=False)}})
        d.prepare_dataset()
        d.cluster.start(*d.all)
        started = time.monotonic()
        d.wait_success(timeout=600)
        final = checks.check_training_complete(d.run_dir, steps)
        ckpts = checks.check_checkpoints(d.run_dir, expected_steps=[2, 4])
        require(d.log_has(d.master, r"ddp rank 0 of 2"), "master: no 'ddp rank 0 of 2' line")
        require(d.log_has(d.workers[0], r"ddp rank 1 of 2"), "worker: no 'ddp rank 1 of 2' line")
        return {
            "train_seconds": round(time.monotonic() - started, 1),
            "eval": {k: final[k] for k in checks.AP_KEYS},
            "checkpoints": ckpts,
        }


def _kill_and_recover(d: Deployment, victim: str, steps: int, period: int, resumed_from: int) -> dict[str, Any]:
    """One fault: wait until training is a checkpoint interval past where it (re)started, SIGKILL
    `victim`; its peers must exit non-zero within RPC_TIMEOUT (+ teardown); restart every pod;
    training must go on from the newest complete checkpoint, losing at most one interval.

    `victim` may end in `:pause`: the container is frozen instead (`docker pause`), a peer that stops
    answering without closing its connections (a hung node, a partition); then only the timeouts
    can notice. It is killed once its peers have exited, as the kubelet or node loss would."""
    victim, _, how = victim.partition(":")
    target = {"master": d.master, "worker-0": d.workers[0], "worker-1": d.workers[-1]}[victim]
    d.wait_until(
        f"training past step {resumed_from + period}",
        lambda: checks.last_train_step(d.run_dir) > resumed_from + period,
        600,
    )
    at_kill, codes, exit_s = _inject_fault(d, target, how, steps)
    lost_at = checks.last_train_step(d.run_dir)
    resume_from = max(checks.checkpoint_steps(d.run_dir), default=0)
    require(
        lost_at - resume_from <= period,
        f"steps {resume_from + 1}..{lost_at} lost: more than one checkpoint interval ({period})",
    )
    checks.check_checkpoints(d.run_dir, just_crashed=True)  # what the crash left: every checkpoint loads
    restarted_at = _restart_and_resume(d, resume_from)
    log.info("%s: killed %s at step %d; peers exited %s after %.1fs; resumed at %d", d.name, victim, at_kill,
             codes, exit_s, resume_from)  # fmt: skip
    return {
        "killed": victim if how != "pause" else f"{victim} (frozen)",
        "killed_at_step": at_kill,
        "peers_exit_codes": codes,
        "peers_exited_after_s": round(exit_s, 1),
        "resumed_from_checkpoint": resume_from,
        "steps_lost": lost_at - resume_from,
        "_restarted_at": restarted_at,
    }


def _inject_fault(d: Deployment, target: str, how: str, steps: int) -> tuple[int, dict[str, int], float]:
    """SIGKILL `target` (or, `how` == "pause", freeze it); every peer must exit non-zero within
    RPC_TIMEOUT plus teardown: a killed peer's closed connection is noticed long before the scenario's
    --rpc-timeout (the trainer's 120 s) could fire; a frozen one only by that timeout (RPC_TIMEOUT
    then), which a peer's log must name. A frozen target is killed once its peers have exited.
    Returns the step at the fault, the peers' exit codes by pod, and the seconds they took to exit."""
    if how == "pause":
        d.cluster.pause(target)
    else:
        d.cluster.kill(target)
    killed_at = time.monotonic()
    at_kill = checks.last_train_step(d.run_dir)
    require(at_kill < steps, f"training finished (step {at_kill}) before the fault could be injected")
    peers = [n for n in d.all if n != target]
    # A frozen peer is noticed by the RPC timeout alone, which is checked in the survivors' logs (torch
    # names the timeout that fired): a verdict load cannot move. The bound on their exit then only
    # catches a hang, with room for the CPU time around the timeout (the step in flight before the call
    # that blocks, the teardown after it), which load stretches: 38 s serially, 43-60 s at load 10-20.
    bound = 4 * RPC_TIMEOUT if how == "pause" else RPC_TIMEOUT + EXIT_MARGIN
    try:
        states = d.cluster.wait_exit(peers, bound, poll=0.25)
    except DockerError as exc:
        raise Failed(f"after killing {target}: {exc}") from exc
    exit_s = time.monotonic() - killed_at
    if how == "pause":
        fired = f"RPC ran for more than set timeout ({RPC_TIMEOUT * 1000} ms)"
        require(any(fired in d.cluster.logs(p) for p in peers), f"no peer of the frozen {target} logged '{fired}'")
        d.cluster.unpause(target)
        d.cluster.kill(target)
        d.cluster.wait_exit([target], 30)
    codes = {n.split(f"{RELEASE}-maskrcnn-dist-")[-1]: s.exit_code for n, s in states.items()}
    require(all(c != 0 for c in codes.values()), f"peers of the killed {target} exited {codes}, expected non-zero")
    return at_kill, codes, exit_s


def _restart_and_resume(d: Deployment, resume_from: int) -> float:
    """Restart every pod, as the StatefulSet controller / kubelet does (same names, same addresses);
    training must go on at the step after the newest complete checkpoint. The restart's time.time()."""
    restarted_at = time.time()
    d.cluster.start(*d.workers, d.master)
    d.wait_until(
        f"training to go on after restarting the pods (from step {resume_from})",
        lambda: bool(checks.train_steps(checks.records_since(d.run_dir, restarted_at))),
        600,
    )
    first = checks.train_steps(checks.records_since(d.run_dir, restarted_at))[0]
    require(
        first == resume_from + 1,
        f"after the restart training went on at step {first}, expected {resume_from + 1} "
        f"(the newest complete checkpoint is step {resume_from})",
    )
    return restarted_at


def _faults(settings: Settings, name: str, victims: list[str], ddp: bool = False) -> dict[str, Any]:
    """Kill `victims` one after the other mid-training, each followed by a restart of every pod. A
    frozen victim is noticed by --rpc-timeout alone: then it is RPC_TIMEOUT, else the trainer's default."""
    period = 3
    steps = period * (len(victims) + 1) + 3
    iters_per_epoch = 8 // (2 * (2 if ddp else 1))  # 8 images, batch 2 per data-parallel rank
    frozen = any(v.endswith(":pause") for v in victims)
    with Deployment(settings, name) as d:
        args = trainer_args(steps, period, synthetic=not ddp, **({"rpc_timeout": RPC_TIMEOUT} if frozen else {}))
        if ddp:
            d.render(DDP_VALUES, {**DDP_CPU_OVERLAY, "trainer": {"args": args}})
            d.prepare_dataset()
        else:
            d.render(CPU_VALUES, {"trainer": {"args": args}})
        d.cluster.start(*d.all)
        faults, resumed_from = [], 0
        for victim in victims:
            faults.append(_kill_and_recover(d, victim, steps, period, resumed_from))
            resumed_from = faults[-1]["resumed_from_checkpoint"]
        d.wait_success(timeout=600)
        resumed = checks.train_steps(checks.records_since(d.run_dir, faults[-1]["_restarted_at"]))
        require(resumed == list(range(resumed_from + 1, steps + 1)), f"steps after the last restart: {resumed}")
        checks.check_training_complete(d.run_dir, steps)
        expected = expected_checkpoints(steps, period, iters_per_epoch)
        ckpts = checks.check_checkpoints(d.run_dir, expected_steps=expected)
        for f in faults:
            f.pop("_restarted_at", None)
        return {"planned_steps": steps, "faults": faults, "checkpoints": ckpts}


def scenario_faults(settings: Settings) -> dict[str, Any]:
    """Pipeline, two faults in one run: worker 2 (stage 2, pod worker-1) killed mid-training, then
    the master; each time the survivors exit non-zero at once (the closed connection), every pod is
    restarted, and training resumes from the newest complete checkpoint; the plan finishes."""
    return _faults(settings, "faults", ["worker-1", "master"])


def scenario_silent_peer(settings: Settings) -> dict[str, Any]:
    """Pipeline: worker 2 frozen (docker pause: no crash, no closed connection) mid-training; the
    master and worker 1 exit non-zero within --rpc-timeout; all pods restarted; resume; finish."""
    return _faults(settings, "silent-peer", ["worker-1:pause"])


def scenario_ddp_fault(settings: Settings) -> dict[str, Any]:
    """ddp: the worker pod killed mid-training; the master exits non-zero; restart; resume; finish."""
    return _faults(settings, "ddp-fault", ["worker-0"], ddp=True)


def scenario_restart_alone(settings: Settings) -> dict[str, Any]:
    """Pipeline: worker 2's container restarted on its own (peers still running), every pod under
    restartPolicy Always with the kubelet's back-off. The peers notice the lost member and exit
    non-zero, their own restarts re-form the group, and it resumes and finishes the plan."""
    steps, period = 10, 3
    with Deployment(settings, "restart-alone") as d:
        d.render(CPU_VALUES, {"trainer": {"args": trainer_args(steps, period)}})
        d.cluster.start(*d.all)
        kubelet = Kubelet(d.cluster, d.all, settings.kubelet_backoff)
        d.wait_until("training past the first checkpoint", lambda: checks.last_train_step(d.run_dir) > period, 600)
        victim = d.workers[-1]
        at = checks.last_train_step(d.run_dir)
        d.cluster.restart(victim, grace=0)  # killed and started again at once, peers still up
        log.info("restart-alone: %s restarted at step %d", victim, at)

        def done() -> bool:
            kubelet.tick()
            exits = kubelet.exits[d.master]
            return bool(exits) and exits[-1] == 0 and checks.last_train_step(d.run_dir) >= steps

        took = d.wait_until("the job to re-form and finish", done, 900, poll=1.0)
        peers = [d.master, d.workers[0]]
        require(
            all(any(c != 0 for c in kubelet.exits[p]) for p in peers),
            f"the peers did not notice the lost pod: exits {kubelet.exits}",
        )
        checks.check_training_complete(d.run_dir, steps)
        checks.check_checkpoints(d.run_dir)
        return {"restarted_at_step": at, "finished_after_s": round(took, 1), "exits": kubelet.exits}
