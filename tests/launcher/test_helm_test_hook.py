"""The chart's `helm test` hook runs the launcher's `wait-master` with the master's address, port and
timeout: rendered with helm, its command is read back and checked against the launcher's own names and
flags, so the chart and the subcommand cannot drift apart."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from maskrcnn_launcher.cli import wait_master
from maskrcnn_launcher.identity import Cluster
from maskrcnn_launcher.yamlfile import load_yaml

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / ".tools"
HOOK = "templates/tests/test-master-reachable.yaml"
RELEASE = "t"
JOBSET_API = "jobset.x-k8s.io/v1alpha2"


@pytest.mark.slow
@pytest.mark.needs_helm
@pytest.mark.parametrize(
    ("args", "workload", "namespace", "port", "timeout"),
    [
        ((), "statefulset", "default", "29500", "300"),
        (
            ("--api-versions", JOBSET_API, "--set", "network.masterPort=29600", "--set", "tests.timeoutSeconds=60"),
            "jobset",
            "vision",
            "29600",
            "60",
        ),
    ],
    ids=["defaults", "jobset-own-port-and-timeout"],
)
def test_the_helm_test_hook_runs_wait_master(
    helm: str, console, args: tuple[str, ...], workload: str, namespace: str, port: str, timeout: str
) -> None:
    render = [helm, "template", RELEASE, str(ROOT / "helm"), "--namespace", namespace, "--show-only", HOOK, *args]
    proc = subprocess.run(render, capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    (container,) = load_yaml(proc.stdout)["spec"]["containers"]
    # The master's DNS name as the launcher derives it for the workers (identity.Cluster).
    fullname = f"{RELEASE}-maskrcnn-dist"
    master = Cluster(fullname, f"{fullname}-headless", namespace, workload=workload).dns_name("master", 0)
    command = ["maskrcnn-launch", "wait-master", "--master-addr", master, "--master-port", port, "--timeout", timeout]
    assert container["command"] == command
    assert "args" not in container

    # The flags exist on the installed console script, and the rendered values pass its checks.
    shown = console("maskrcnn-launch", "wait-master", "--help")
    assert shown.code == 0, shown.stderr
    for flag in (arg for arg in command[2:] if arg.startswith("--")):
        assert f"{flag} " in shown.stdout, (flag, shown.stdout)
    parsed = wait_master.make_context("wait-master", command[2:]).params
    assert parsed == {"master_addr": master, "master_port": int(port), "timeout": float(timeout)}
