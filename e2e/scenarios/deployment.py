"""A scenario's deployment: the chart rendered into a fresh emulated cluster, its pods' containers, the
shared volume on the host, and the waits every scenario uses.

Every scenario runs inside one `Deployment`, whose exit keeps each container's log and a copy of the
metrics under `runs/e2e/<scenario>/` and then removes its containers and its network, whatever
happened.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from maskrcnn_dist.run_dir import METRICS_FILE

from ..checks import Failed, require
from ..cluster import Attempt, Cluster, DockerError, JobSetController, PodSpec, jobset_controller, pvc_dir
from .chart import Release, helm_template, render_release
from .common import NAMESPACE, RELEASE, RUN_DIR, WAIT_TIMEOUT, Settings

log = logging.getLogger("e2e")


class Deployment:
    """One scenario's release: rendered pods, their containers, the shared volume on the host."""

    def __init__(self, settings: Settings, name: str) -> None:
        self.settings = settings
        self.name = name
        # Unique among the scenarios running at once: it names the network, the containers and the host folder.
        self.run_id = settings.session + secrets.token_hex(3)
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
        """The scenario's ci/ values file and the harness's overlay (image, wait bound, device-map guard,
        the scenario's)."""
        repo, _, tag = self.settings.image.rpartition(":")
        overlay = {"image": {"repository": repo, "tag": tag, "pullPolicy": "Never"}, **overlay}
        # Every pipeline pod walks its RPC results as a device-map agent would (engines/pipeline/guard.py).
        guard = {"name": "MASKRCNN_DEVICE_MAP_GUARD", "value": "1"}
        overlay.setdefault("extraEnv", [{"name": "MASKRCNN_WAIT_TIMEOUT", "value": str(WAIT_TIMEOUT)}, guard])
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
        return self.run_jobset(helm_template(self.settings.helm, RELEASE, NAMESPACE, files), start)

    def run_jobset(self, objects: list[dict[str, Any]], start: bool = True) -> JobSetController:
        """The JobSet among `objects` (rendered, or made by an emulated controller from what was),
        run by the emulated JobSet controller; its pods are the release's."""

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

    def write_pods(self, pods: list[PodSpec], file: str) -> None:
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

    def prepare_dataset(self, train_images: int = 8) -> None:
        """What a user does before a ddp run: put the dataset on the volume (here: the synthetic set)."""
        run_as, fs_group, claim = self.data_claim()
        synth = ["synth-data", "--output", "/data/synthetic", "--train-images", str(train_images), "--val-images", "4"]
        self.cluster.run_once(
            f"e2e-{self.run_id}-dataset",
            self.settings.image,
            ["maskrcnn-dist", *synth, "--image-size", "96"],
            user=f"{run_as}:{fs_group}",
            mounts=[f"type=bind,source={pvc_dir(self.cluster.host_dir, claim, fs_group)},target=/data"],
            timeout=300,
        )

    def data_claim(self) -> tuple[int, int, str]:
        """The training pods' user, fsGroup and data claim: the master's, or before a JobSet has started
        (no pods yet), its first replicated job's pod template's."""
        if self.release is not None:
            pod = self.release.master
            return pod.run_as_user or 0, pod.fs_group or 0, next(m.claim for m in pod.mounts if m.kind == "pvc")
        spec = self.jobset.spec.replicated_jobs[0].pod_template["spec"]
        context = spec.get("securityContext") or {}
        claim = next(v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"] if "persistentVolumeClaim" in v)
        return context.get("runAsUser") or 0, context.get("fsGroup") or 0, claim

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
