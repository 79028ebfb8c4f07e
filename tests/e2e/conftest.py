"""What the e2e harness's tests share: the top-level `e2e` package on the path, and the emulated JobSet
controller run over the chart's rendered JobSet on a fake cluster whose containers the test ends."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the top-level `e2e` package

from e2e.cluster import ContainerState, JobSetController, jobset_controller  # noqa: E402
from e2e.scenarios.chart import CPU_VALUES, helm_template  # noqa: E402


class FakeCluster:
    """What the JobSet controller asks of a docker Cluster, without docker: the test ends containers.
    Each exit is a second after the one before, unless the test says when; a stopped container (a
    deleted pod) exits `stop_code`: 143 for a process that dies of SIGTERM, 75 for the trainer's
    clean stop."""

    def __init__(self) -> None:
        self.containers: list[str] = []
        self.states: dict[str, ContainerState] = {}
        self.pods: dict[str, object] = {}
        self.stopped: list[str] = []
        self.stop_code = 143
        self._ips = 0
        self._clock = itertools.count(1)

    def ip_for(self, name: str) -> str:
        self._ips += 1
        return f"10.0.0.{self._ips}"

    def container_name(self, pod) -> str:
        return f"c-{pod.name}"

    def create_pod(self, pod, labels=None) -> str:
        name = self.container_name(pod)
        self.containers.append(name)
        self.pods[name] = pod
        self.states[name] = ContainerState("created", 0, "", "0001-01-01T00:00:00Z", 0)
        return name

    def start(self, *names: str) -> None:
        for name in names:
            self.states[name] = ContainerState("running", 0, "2025-01-01T00:00:00Z", "0001-01-01T00:00:00Z", 1)

    def state(self, name: str) -> ContainerState:
        return self.states[name]

    def exit(self, name: str, code: int, second: int | None = None) -> None:
        second = next(self._clock) if second is None else second
        finished = f"2025-01-01T00:{second // 60:02d}:{second % 60:02d}.123456789Z"
        self.states[name] = ContainerState("exited", code, "", finished, 0)

    def stop(self, names, grace: float) -> None:
        for name in names:
            self.stopped.append(name)
            self.exit(name, self.stop_code)

    def running(self) -> list[str]:
        return [n for n, s in self.states.items() if s.status == "running"]


@pytest.fixture
def jobset_render(helm, tmp_path) -> Callable[..., list[dict[str, Any]]]:
    """jobset_render(overlay, values=ci/cpu-values.yaml) -> the chart rendered as a JobSet, release e2e."""
    files = itertools.count()

    def render(overlay: dict[str, Any] | None = None, values: Path = CPU_VALUES) -> list[dict[str, Any]]:
        path = tmp_path / f"overlay-{next(files)}.yaml"
        path.write_text(yaml.safe_dump({"workload": "jobset", **(overlay or {})}))
        return helm_template(helm, "e2e", "e2e", [values, path])

    return render


@pytest.fixture
def jobset_run(jobset_render) -> Callable[..., tuple[JobSetController, FakeCluster]]:
    """jobset_run(overlay, values) -> the emulated JobSet controller over that render, started on a FakeCluster."""

    def run(overlay: dict[str, Any] | None = None, values: Path = CPU_VALUES) -> tuple[JobSetController, FakeCluster]:
        cluster = FakeCluster()
        controller = jobset_controller(jobset_render(overlay, values), "e2e", cluster)
        controller.start()
        return controller, cluster

    return run
