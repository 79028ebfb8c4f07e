"""The launcher run in a rendered pod's place: `maskrcnn-launch launch --dry-run` with the environment
the kubelet would give the container (values, the downward API, a JobSet pod's host name).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from maskrcnn_launcher import contract
from maskrcnn_launcher.contract import JOBSET_FIELDS

from .objects import topology_text


def pod_environment(
    container: dict[str, Any],
    pod_name: str,
    pod_ip: str,
    topology_file: Path,
    fields: dict[str, str] | None = None,
    hostname: str | None = None,
) -> dict[str, str]:
    """What the kubelet would give the container: values, downward API fields (`fields` adds label and
    annotation paths), the host name when the pod has its own (a JobSet's), nothing else."""
    fields = {"metadata.name": pod_name, "metadata.namespace": "default", "status.podIP": pod_ip, **(fields or {})}
    env = {"PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin"}
    if hostname:
        env["HOSTNAME"] = hostname
    for item in container["env"]:
        env[item["name"]] = item["value"] if "value" in item else fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
    # The ConfigMap is mounted at MASKRCNN_TOPOLOGY in the pod; here it is a file in tmp_path.
    env["MASKRCNN_TOPOLOGY"] = str(topology_file)
    return env


def launcher_command() -> list[str]:
    """`maskrcnn-launch` as this test imports it (the tree under test, whatever is installed)."""
    import maskrcnn_launcher

    return [
        "env",
        f"PYTHONPATH={Path(maskrcnn_launcher.__file__).parents[1]}",
        sys.executable,
        "-m",
        "maskrcnn_launcher",
    ]


def expand(arg: str, env: dict[str, str]) -> str:
    """The kubelet's expansion of $(VAR) references in args from the container's environment."""
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), arg)


def write_topology(objects: list[dict[str, Any]], folder: Path) -> Path:
    """The topology ConfigMap's file, where the launcher can read it (the pod mounts it)."""
    path = folder / "topology.yaml"
    path.write_text(topology_text(objects))
    return path


def launch_dry_run(container: dict[str, Any], env: dict[str, str], pod: str):
    """`launch --dry-run` with the container's arguments in its environment: (its PodPlan, the whole
    answer, the expanded arguments)."""
    from maskrcnn_launcher.contract import PodPlan

    args = [expand(arg, env) for arg in container["args"]]
    command = [*launcher_command(), args[0], "--dry-run", *args[1:]]
    proc = subprocess.run(command, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, f"{pod}: {proc.stderr}"
    out = json.loads(proc.stdout)
    return PodPlan.from_json(out["env"]["MASKRCNN_POD_PLAN"]), out, args


def jobset_fields(jobset: str, rjob: str, index: int, labelled: bool) -> dict[str, str]:
    """The downward API over the labels and annotation the JobSet and Job controllers add to a pod.
    `labelled=False`: a pod without them (the downward API gives empty strings), where the launcher
    falls back to the host name."""
    keys = {
        contract.JOBSET_NAME_LABEL: jobset,
        contract.REPLICATED_JOB_LABEL: rjob,
        contract.JOB_INDEX_LABEL: "0",
        contract.COMPLETION_INDEX_ANNOTATION: str(index),
    }
    return {path: keys[path.split("['", 1)[1][:-2]] if labelled else "" for path in JOBSET_FIELDS.values()}
