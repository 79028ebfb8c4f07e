"""The end-to-end scenarios. Each deploys the chart's pods as containers, acts, and asserts.

Every scenario is bounded in time (each wait has its own limit, and `make e2e` adds one over the
whole run) and runs inside a `Cluster`, whose `close()` removes its containers and its network
whatever happened. Logs of every container and a copy of the metrics are kept under
`runs/e2e/<scenario>/` for the person reading a failure.

Pods: release `e2e` in namespace `e2e`, so the master is
`e2e-maskrcnn-dist-master-0.e2e-maskrcnn-dist-headless.e2e.svc.cluster.local`, or as a JobSet pod
`e2e-maskrcnn-dist-master-0-0.e2e-maskrcnn-dist-headless.e2e.svc.cluster.local` (the `jobset*` scenarios,
whose controller is emulated by jobset.py).
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from maskrcnn_dist.config import small_cpu_run, to_argv
from maskrcnn_dist.run_dir import METRICS_FILE

from . import checks
from .checks import Failed, require
from .cluster.docker import LABEL, Cluster, DockerError, docker, pvc_dir
from .cluster.jobset import Attempt, JobSetController, jobset_controller
from .cluster.pods import CHART, ROOT, Release, helm_template, render_release

log = logging.getLogger("e2e")

RELEASE = "e2e"
NAMESPACE = "e2e"
RUN_DIR = f"/data/runs/{RELEASE}"  # the chart's --output-dir, /data/runs/{{ .Release.Name }}
RPC_TIMEOUT = 30  # --rpc-timeout: "seconds before a silent peer counts as lost"
EXIT_MARGIN = 15  # process teardown on top of it (interpreter exit, torchrun's agent)
WAIT_TIMEOUT = 240  # MASKRCNN_WAIT_TIMEOUT: how long a worker waits for the master


@dataclass
class Settings:
    helm: str
    image: str
    out: Path  # runs/e2e
    kubelet_backoff: float = 10.0  # the kubelet's first crash-loop back-off


@dataclass
class Result:
    name: str
    ok: bool
    seconds: float
    detail: str = ""
    facts: dict[str, Any] = field(default_factory=dict)


def trainer_args(
    steps: int,
    checkpoint_period: int,
    synthetic: bool = True,
    keep: int = 50,
    epochs: int = 20,
    extra: tuple[str, ...] = (),
) -> list[str]:
    """The small CPU run (config.small_cpu_run): R18-FPN at 64-96 px, 8 synthetic images, batch 2, one
    thread per process."""
    flags = small_cpu_run(
        96,
        min_size=64,
        data_path="/data/synthetic",
        **({"synthetic_images": 8, "synthetic_image_size": 96} if synthetic else {}),
        batch_size=2,
        workers=0,
        threads=1,
        flush_denormal=True,
        epochs=epochs,
        max_steps=steps,
        eval_every_epoch=False,
        checkpoint_period=checkpoint_period,
        keep_checkpoints=keep,
        rpc_timeout=RPC_TIMEOUT,
        print_freq=1,
    )
    return [*to_argv(flags), *extra, "--output-dir", "/data/runs/{{ .Release.Name }}", "--resume", "auto"]


class Deployment:
    """One scenario's release: rendered pods, their containers, the shared volume on the host."""

    def __init__(self, settings: Settings, name: str) -> None:
        self.settings = settings
        self.name = name
        self.run_id = secrets.token_hex(3)
        self.out = settings.out / name
        shutil.rmtree(self.out, ignore_errors=True)
        self.out.mkdir(parents=True)
        self.cluster = Cluster(self.run_id, settings.out / f".work-{name}-{self.run_id}")
        self.release: Release | None = None
        self.names: dict[str, str] = {}  # pod name -> container name
        self.jobset: JobSetController | None = None  # the emulated controller of a JobSet release

    def __enter__(self) -> Deployment:
        self.cluster.open()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.cluster.save_logs(self.out)
            self.keep_metrics()
            if self.jobset is not None:
                status = {**self.jobset.status(), "events": self.jobset.events}
                (self.out / "jobset-status.json").write_text(json.dumps(status, indent=1))
        finally:
            self.cluster.close()

    # -- deploying --------------------------------------------------------------------------

    def values_files(self, values_file: Path, overlay: dict[str, Any]) -> list[Path]:
        """The scenario's ci/ values file and the harness's overlay (image, wait bound, the scenario's)."""
        repo, _, tag = self.settings.image.rpartition(":")
        overlay = {"image": {"repository": repo, "tag": tag, "pullPolicy": "Never"}, **overlay}
        overlay.setdefault("extraEnv", [{"name": "MASKRCNN_WAIT_TIMEOUT", "value": str(WAIT_TIMEOUT)}])
        overlay_file = self.cluster.host_dir / "e2e-values.yaml"
        overlay_file.write_text(yaml.safe_dump(overlay))
        return [values_file, overlay_file]

    def render(self, values_file: Path, overlay: dict[str, Any]) -> Release:
        """The StatefulSets' pods, created (not started): the scenario plays the kubelet."""
        files = self.values_files(values_file, overlay)
        self.release = render_release(self.settings.helm, RELEASE, NAMESPACE, files, self.cluster.ip_for)
        for pod in self.release.pods:
            self.names[pod.name] = self.cluster.create_pod(pod)
        log.info("%s: pods %s", self.name, ", ".join(f"{p.name} ({p.pod_ip})" for p in self.release.pods))
        self.write_pods(self.release.pods, "pods.json")
        return self.release

    def render_jobset(self, values_file: Path, overlay: dict[str, Any], start: bool = True) -> JobSetController:
        """The chart rendered as a JobSet, run by the emulated JobSet controller (started unless `start`
        is false: the scenario calls `start()` once it has prepared the volume)."""
        files = self.values_files(values_file, {"workload": "jobset", **overlay})
        objects = helm_template(self.settings.helm, RELEASE, NAMESPACE, files)

        def on_attempt(attempt: Attempt) -> None:
            # Each restart makes new pods (new names, same host names): they are the release's pods now.
            pods = self.jobset.pod_specs()
            self.release = Release(RELEASE, NAMESPACE, pods, objects)
            self.names = {p.name: self.cluster.container_name(p) for p in pods}
            self.write_pods(pods, f"pods-attempt-{attempt.number}.json")

        self.jobset = jobset_controller(objects, NAMESPACE, self.cluster, on_attempt)
        if start:
            self.jobset.start()
        return self.jobset

    def write_pods(self, pods, file: str) -> None:
        rendered = {
            p.name: {"hostname": p.host, "env": p.env, "args": p.args, "mounts": [m.path for m in p.mounts]}
            for p in pods
        }
        (self.out / file).write_text(json.dumps(rendered, indent=1))

    @property
    def master(self) -> str:
        return self.names[self.release.master.name]

    @property
    def workers(self) -> list[str]:
        return [self.names[p.name] for p in self.release.workers]

    @property
    def all(self) -> list[str]:
        return [self.master, *self.workers]

    @property
    def volume(self) -> Path:
        """The host folder standing in for the release's PersistentVolumeClaim."""
        claim = next(m.claim for m in self.release.master.mounts if m.kind == "pvc")
        return self.cluster.host_dir / "volumes" / claim

    @property
    def run_dir(self) -> Path:
        return self.volume / RUN_DIR.removeprefix("/data/")

    def keep_metrics(self) -> None:
        if self.release is not None and (self.run_dir / METRICS_FILE).is_file():
            shutil.copy(self.run_dir / METRICS_FILE, self.out / METRICS_FILE)

    def prepare_dataset(self) -> None:
        """What a user does before a ddp run: put the dataset on the volume (here: the synthetic set)."""
        pod = self.release.master
        name = f"e2e-{self.run_id}-dataset"
        uid, gid = pod.run_as_user or 0, pod.fs_group or 0
        self.cluster.adopt(name)
        docker(
            "run", "--name", name, "--label", f"{LABEL}=1", "--user", f"{uid}:{gid}", "--network", "none",
            "--mount", f"type=bind,source={self.volume_for_prepare()},target=/data", self.settings.image,
            "maskrcnn-dist", "synth-data", "--output", "/data/synthetic", "--train-images", "8",
            "--val-images", "4", "--image-size", "96",
            timeout=300,
        )  # fmt: skip

    def volume_for_prepare(self) -> Path:
        pod = self.release.master
        claim = next(m.claim for m in pod.mounts if m.kind == "pvc")
        return pvc_dir(self.cluster.host_dir, claim, pod.fs_group or 0)

    # -- watching -----------------------------------------------------------------------------

    def wait_until(self, what: str, condition: Callable[[], bool], timeout: float, poll: float = 0.5) -> float:
        """Wait for `condition`; fail naming `what` and each container's state at the bound."""
        started = time.monotonic()
        while not condition():
            if time.monotonic() - started > timeout:
                states = {n: self.cluster.state(n).status for n in self.cluster.containers}
                raise Failed(f"{what}: not within {timeout:.0f}s (containers: {states})")
            time.sleep(poll)
        return time.monotonic() - started

    def exited(self, name: str) -> bool:
        return self.cluster.state(name).status == "exited"

    def wait_success(self, timeout: float, names: list[str] | None = None) -> dict[str, int]:
        """Wait for the containers to exit; all must exit 0."""
        names = names or self.all
        try:
            states = self.cluster.wait_exit(names, timeout)
        except DockerError as exc:
            raise Failed(str(exc)) from exc
        codes = {n: s.exit_code for n, s in states.items()}
        require(all(c == 0 for c in codes.values()), f"exit codes {codes} (logs under {self.out})")
        return codes

    def log_has(self, name: str, pattern: str) -> bool:
        return re.search(pattern, self.cluster.logs(name)) is not None


class Kubelet:
    """restartPolicy: Always for a set of containers, with the kubelet's crash-loop back-off
    (10 s, doubled per restart, capped at 300 s). StatefulSet pods can have no other policy."""

    def __init__(self, cluster: Cluster, names: list[str], base: float) -> None:
        self.cluster, self.names, self.base = cluster, names, base
        self.restarts = {n: 0 for n in names}
        self.exits: dict[str, list[int]] = {n: [] for n in names}
        self._seen = {n: cluster.state(n).finished_at for n in names}
        self._due: dict[str, float] = {}

    def tick(self) -> None:
        now = time.monotonic()
        for name in self.names:
            state = self.cluster.state(name)
            if state.status == "exited" and state.finished_at != self._seen[name]:
                self._seen[name] = state.finished_at
                self.exits[name].append(state.exit_code)
                delay = min(self.base * 2 ** self.restarts[name], 300.0)
                self._due[name] = now + delay
                log.info("kubelet: %s exited %d; restart in %.0fs", name, state.exit_code, delay)
            if name in self._due and now >= self._due[name]:
                del self._due[name]
                self.restarts[name] += 1
                self.cluster.start(name)


# -- scenarios -----------------------------------------------------------------------------------

CPU_VALUES = CHART / "ci" / "cpu-values.yaml"
DDP_VALUES = CHART / "ci" / "ddp-values.yaml"
# ci/ddp-values.yaml describes GPU machines; the overlay keeps its engine and storage layout but
# runs two CPU pods (master + 1 worker, gloo) with small requests.
DDP_CPU_OVERLAY = {
    "ddp": {"workers": 1},
    "master": {"gpus": 0, "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "4Gi"}}},
    "worker": {"gpus": 0, "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "4Gi"}}},
    "shmSize": "512Mi",
    "scratchSize": "1Gi",
}


POSTURE_PROBE = r"""
echo "user $(id -u)"; echo "groups $(id -G)"
grep -E '^(NoNewPrivs|CapEff):' /proc/self/status | tr -s '\t ' ' '
touch /opt/probe 2>/dev/null && echo root-writable || echo root-read-only
touch /tmp/probe && echo tmp-writable
touch "$HOME/probe" && echo home-writable
df -k /dev/shm | awk 'NR==2 {print "shm-kb", $2}'
test -r "$MASKRCNN_TOPOLOGY" && ! touch "$MASKRCNN_TOPOLOGY" 2>/dev/null && echo topology-read-only
"""


def check_posture(d: Deployment, container: str, pod) -> dict[str, Any]:
    """Inside a running pod container: the user, no capabilities, no-new-privileges, a read-only
    root with writable scratch emptyDirs, /dev/shm at the pod's size, the topology mounted read-only."""
    out = docker("exec", container, "sh", "-c", POSTURE_PROBE, timeout=60).stdout.splitlines()
    from .cluster.docker import quantity_bytes

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
        time.sleep(30)
        for w in d.workers:
            require(d.cluster.state(w).running, f"{w} did not wait for the master: {d.cluster.state(w)}")
            require(d.log_has(w, r"waiting for master \S+ to resolve"), f"{w}: no 'waiting for master' log line")
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


def expected_checkpoints(steps: int, period: int, iters_per_epoch: int) -> list[int]:
    """Periodic checkpoints, one at every epoch end, and the last step."""
    return sorted({*range(period, steps + 1, period), *range(iters_per_epoch, steps + 1, iters_per_epoch), steps})


def _kill_and_recover(d: Deployment, victim: str, steps: int, period: int, resumed_from: int) -> dict[str, Any]:
    """One fault: wait until training is a checkpoint interval past where it (re)started, SIGKILL
    `victim`; its peers must exit non-zero within --rpc-timeout (+ teardown); restart every pod;
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
    if how == "pause":
        docker("pause", target)
    else:
        d.cluster.kill(target)
    killed_at = time.monotonic()
    at_kill = checks.last_train_step(d.run_dir)
    require(at_kill < steps, f"training finished (step {at_kill}) before the fault could be injected")
    peers = [n for n in d.all if n != target]
    try:
        states = d.cluster.wait_exit(peers, RPC_TIMEOUT + EXIT_MARGIN, poll=0.25)
    except DockerError as exc:
        raise Failed(f"after killing {target}: {exc}") from exc
    exit_s = time.monotonic() - killed_at
    if how == "pause":
        docker("unpause", target)
        d.cluster.kill(target)
        d.cluster.wait_exit([target], 30)
    codes = {n.split(f"{RELEASE}-maskrcnn-dist-")[-1]: s.exit_code for n, s in states.items()}
    require(all(c != 0 for c in codes.values()), f"peers of the killed {target} exited {codes}, expected non-zero")
    lost_at = checks.last_train_step(d.run_dir)
    resume_from = max(checks.checkpoint_steps(d.run_dir), default=0)
    require(
        lost_at - resume_from <= period,
        f"steps {resume_from + 1}..{lost_at} lost: more than one checkpoint interval ({period})",
    )
    checks.check_checkpoints(d.run_dir, just_crashed=True)  # what the crash left: every checkpoint loads
    restarted_at = time.time()
    # The StatefulSet controller / kubelet restarts every pod (same names, same addresses).
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


def _faults(settings: Settings, name: str, victims: list[str], ddp: bool = False) -> dict[str, Any]:
    """Kill `victims` one after the other mid-training, each followed by a restart of every pod."""
    period = 3
    steps = period * (len(victims) + 1) + 3
    iters_per_epoch = 8 // (2 * (2 if ddp else 1))  # 8 images, batch 2 per data-parallel rank
    with Deployment(settings, name) as d:
        args = trainer_args(steps, period, synthetic=not ddp)
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
    the master; each time the survivors exit non-zero within --rpc-timeout, every pod is restarted,
    and training resumes from the newest complete checkpoint; the plan finishes."""
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
        docker("restart", "--time", "0", victim)  # killed and started again at once, peers still up
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


def extract_recipe(readme: Path) -> tuple[str, Path]:
    """The fenced block after `<!-- e2e: bare-nodes -->` in README.md: the recipe users copy."""
    m = re.search(r"<!-- e2e: bare-nodes -->\s*```(?:bash|sh)?\n(.*?)```", readme.read_text(), re.S)
    if not m:
        raise Failed(f"no '<!-- e2e: bare-nodes -->' recipe block in {readme}")
    return m.group(1), readme


def set_site_variables(recipe: str, site: dict[str, str]) -> str:
    """What a user edits before running the recipe: the values of its `VAR=...` lines, nothing else."""
    for key, value in site.items():
        recipe, count = re.subn(rf"(?m)^{key}=\S*", lambda _m, k=key, v=value: f"{k}={shlex.quote(v)}", recipe)
        require(count == 1, f"the recipe should set {key} once at the start of a line (found {count})")
    return recipe


def scenario_bare_nodes(settings: Settings) -> dict[str, Any]:
    """The README's `docker run` recipe for three bare nodes, run as written; the docker network
    stands in for the hosts' network (NET), container names for host names (MASTER)."""
    recipe, source = extract_recipe(ROOT / "README.md")
    names = re.findall(r"--name\s+(\S+)", recipe)
    require(len(names) == 3, f"the recipe in {source} should start 3 named containers, found {names}")
    steps = int(re.search(r"--max-steps\s+(\d+)", recipe).group(1))
    taken = [n for n in names if docker("container", "inspect", n, check=False).returncode == 0]
    require(not taken, f"containers named {taken} exist already (a killed run's?): docker rm -f {' '.join(taken)}")
    with Deployment(settings, "bare-nodes") as d:
        for n in names:
            d.cluster.adopt(n)
        data = d.cluster.host_dir / "srv-maskrcnn"
        site = {"IMAGE": settings.image, "MASTER": names[0], "NET": d.cluster.network, "DATA": str(data)}
        script = "set -euo pipefail\n" + set_site_variables(recipe, site)
        (d.out / "recipe.sh").write_text(script)
        started = time.monotonic()
        try:
            proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired as exc:
            raise Failed("the recipe did not finish within 600 s") from exc
        (d.out / "recipe.out").write_text(proc.stdout + proc.stderr)
        require(proc.returncode == 0, f"the recipe exited {proc.returncode}: {proc.stderr[-2000:]}")
        codes = {n: d.cluster.state(n).exit_code for n in names}
        try:
            states = d.cluster.wait_exit(names, 120)
        except DockerError as exc:
            raise Failed(str(exc)) from exc
        codes = {n: s.exit_code for n, s in states.items()}
        require(all(c == 0 for c in codes.values()), f"exit codes {codes}")
        run_dir = data / re.search(r"--output-dir\s+/data/(\S+)", recipe).group(1)
        final = checks.check_training_complete(run_dir, steps)
        checks.check_checkpoints(run_dir)
        shutil.copy(run_dir / METRICS_FILE, d.out / METRICS_FILE)
        return {
            "recipe": str(source.relative_to(ROOT)),
            "train_seconds": round(time.monotonic() - started, 1),
            "eval": {k: final[k] for k in checks.AP_KEYS},
        }


# -- JobSet: the chart's JobSet run by the emulated JobSet controller (jobset.py) -------------------

# How long a finished JobSet is watched for anything starting again.
SETTLE_S = 15.0


def _run_jobset(d: Deployment, timeout: float = 900) -> str:
    try:
        return d.jobset.run(timeout)
    except DockerError as exc:
        raise Failed(str(exc)) from exc


def _check_finished_for_good(d: Deployment) -> dict[str, Any]:
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


def _jobset_facts(d: Deployment, started: float) -> dict[str, Any]:
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
        state = _run_jobset(d)
        require(state == "Completed", f"the JobSet ended {state}: {js.condition} ({js.describe()})")
        require(js.restarts == 0, f"{js.restarts} restarts in a run without faults")
        exits = _check_finished_for_good(d)
        require(exits[f"{RELEASE}-maskrcnn-dist-master-0-0"] == 0, f"the master exited {exits}")
        final = checks.check_training_complete(d.run_dir, steps)
        ckpts = checks.check_checkpoints(d.run_dir, expected_steps=[2, 4])
        for pod in js.pods("workers"):
            require(d.log_has(pod.container, r"accepts connections"), f"{pod.spec.host}: never reached the master")
        return {
            **_jobset_facts(d, started),
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
        state = _run_jobset(d)
        require(state == "Completed", f"the JobSet ended {state}: {js.condition} ({js.describe()})")
        require(js.restarts == 1 and len(resumes) == 1, f"{js.restarts} restarts, expected 1 ({js.events})")
        _check_finished_for_good(d)
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
            **_jobset_facts(d, started),
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
    """A user error: the JobSet fails through its UserError rule without a restart, the master exits 2
    with an `error: ...` line holding `error_text`, and nothing runs afterwards."""
    js = d.jobset
    assert js is not None, "render_jobset first"
    state = _run_jobset(d, timeout=300)
    require(state == "Failed", f"the JobSet ended {state}: {js.condition}")
    require(js.condition.reason == "FailJobSetFailurePolicyAction", f"failed for {js.condition}")
    require(js.restarts == 0 and len(js.attempts) == 1, f"a user error was retried: {js.events}")
    master = js.pods("master")[0]
    require(master.exit_code == 2, f"the master exited {master.exit_code}, expected 2 (a user error)")
    line = next((ln for ln in d.cluster.logs(master.container).splitlines() if ln.startswith("error: ")), None)
    require(line is not None and error_text in line, f"no 'error: ... {error_text}' line in the master log")
    exits = _check_finished_for_good(d)
    return {**_jobset_facts(d, started), "message": js.condition.message, "error_line": line, "exit_codes": exits}


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
        state = _run_jobset(d, timeout=300)
        require(state == "Failed", f"the JobSet ended {state}: {js.condition}")
        require(js.condition.reason == "ReachedMaxRestarts", f"failed for {js.condition}")
        require(js.restarts == 2 and len(js.attempts) == 3, f"{js.restarts} restarts, {len(js.attempts)} attempts")
        for attempt in js.attempts:
            (master_job,) = [j for j in attempt.jobs if j.replicated_job == "master"]
            require(master_job.reason == "BackoffLimitExceeded", f"attempt {attempt.number}: {master_job}")
        _check_finished_for_good(d)
        return {**_jobset_facts(d, started), "message": js.condition.message, "events": js.events}


SCENARIOS: dict[str, Callable[[Settings], dict[str, Any]]] = {
    "pipeline": scenario_pipeline,
    "ddp": scenario_ddp,
    "bare-nodes": scenario_bare_nodes,
    "faults": scenario_faults,
    "restart-alone": scenario_restart_alone,
    "silent-peer": scenario_silent_peer,
    "ddp-fault": scenario_ddp_fault,
    "jobset": scenario_jobset,
    "jobset-lost-worker": scenario_jobset_lost_worker,
    "jobset-user-error": scenario_jobset_user_error,
    "jobset-user-error-ddp": scenario_jobset_user_error_ddp,
    "jobset-max-restarts": scenario_jobset_max_restarts,
}
# Until the pipeline engine lands, `--engines ddp` runs only what needs no pipeline.
DDP_ONLY = ("ddp", "ddp-fault", "jobset-user-error-ddp")
