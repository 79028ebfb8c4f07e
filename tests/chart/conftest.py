"""Fixtures for the chart tests: a helm binary (fetched when none is installed) and rendered objects.

helm comes from PATH, else from .tools/ (where `make helm` puts it), else helm/hack/get-helm.sh
fetches the pinned one now: a missing helm is a failure with a reason, never a silent skip.

Every scenario is rendered twice: as for a cluster without JobSet, and as for one that serves
`jobset.x-k8s.io/v1alpha2` (`--api-versions`), where `workload: auto` renders a JobSet.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from maskrcnn_launcher.yamlfile import load_yaml_all

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm"
TOOLS = ROOT / ".tools"
RELEASE = "t"
JOBSET_API = "jobset.x-k8s.io/v1alpha2"
# The JobSet CRD as published by kubernetes-sigs/jobset v0.12.0 (config/components/crd/bases), which the
# JobSet render is validated against: ../shared/schemas/ beside the checkout (see its README), or the
# file MASKRCNN_JOBSET_CRD names. Pinned by hash, so a changed file cannot pass for the published one.
JOBSET_CRD = Path(
    os.environ.get("MASKRCNN_JOBSET_CRD") or ROOT.parent / "shared" / "schemas" / "jobset.x-k8s.io_jobsets-v0.12.0.yaml"
)
JOBSET_CRD_SHA256 = "d022b87624512cf0b6741b31b24a2bea9945b5a838b50713af29332c878bb6fe"
# Scenario name -> values file (None: the chart's defaults, which k8s/ is rendered from).
SCENARIOS: dict[str, Path | None] = {
    "default": None,
    **{p.name.removesuffix("-values.yaml"): p for p in sorted((CHART / "ci").glob("*-values.yaml"))},
}


@pytest.fixture(scope="session")
def helm() -> str:
    found = shutil.which("helm") or (str(TOOLS / "helm") if (TOOLS / "helm").is_file() else None)
    if found:
        return found
    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.run([str(CHART / "hack" / "get-helm.sh"), str(TOOLS)], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.fail(f"no helm on PATH and helm/hack/get-helm.sh failed:\n{proc.stdout}\n{proc.stderr}")
    return str(TOOLS / "helm")


@pytest.fixture(scope="session")
def run_helm(helm: str) -> Callable[..., subprocess.CompletedProcess[str]]:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([helm, *args], capture_output=True, text=True, cwd=ROOT)

    return run


def values_args(values_file: Path | None, sets: tuple[str, ...] = ()) -> list[str]:
    args = ["-f", str(values_file)] if values_file else []
    for item in sets:
        args += ["--set", item]
    return args


def api_args(jobset_api: bool) -> list[str]:
    """What `helm template` is told the cluster serves besides the built-in APIs."""
    return ["--api-versions", JOBSET_API] if jobset_api else []


def load_manifests(text: str) -> list[dict[str, Any]]:
    """The objects of `helm template` output, every mapping's keys unique."""
    return load_yaml_all(text)


@pytest.fixture(scope="session")
def render(run_helm) -> Callable[..., list[dict[str, Any]]]:
    """render(scenario, *--set items, jobset_api=False, release=RELEASE) -> the rendered objects (helm
    test hooks included), cached. `jobset_api`: render as for a cluster that serves the JobSet API."""
    cache: dict[tuple[str, tuple[str, ...], bool, str], list[dict[str, Any]]] = {}

    def _render(scenario: str, *sets: str, jobset_api: bool = False, release: str = RELEASE) -> list[dict[str, Any]]:
        key = (scenario, sets, jobset_api, release)
        if key not in cache:
            args = values_args(SCENARIOS[scenario], sets) + api_args(jobset_api)
            proc = run_helm("template", release, str(CHART), *args)
            assert proc.returncode == 0, f"helm template {scenario} {sets} {jobset_api=} failed:\n{proc.stderr}"
            cache[key] = load_manifests(proc.stdout)
        return cache[key]

    return _render


@pytest.fixture(scope="session")
def values() -> Callable[[str], dict[str, Any]]:
    """The merged values of a scenario (chart defaults overlaid by its ci file, shallow per key)."""
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())

    def merge(base: Any, over: Any) -> Any:
        if isinstance(base, dict) and isinstance(over, dict):
            return {k: merge(base.get(k), over[k]) if k in base else over[k] for k in over} | {
                k: v for k, v in base.items() if k not in over
            }
        return over

    def _values(scenario: str) -> dict[str, Any]:
        path = SCENARIOS[scenario]
        return merge(defaults, yaml.safe_load(path.read_text())) if path else defaults

    return _values


@pytest.fixture(scope="session")
def jobset_schema() -> dict[str, Any]:
    """The CRD's v1alpha2 openAPIV3Schema, made strict: a field it does not name is an error."""
    import hashlib

    if not JOBSET_CRD.is_file():
        pytest.fail(f"the JobSet CRD is not at {JOBSET_CRD} (set MASKRCNN_JOBSET_CRD to the published v0.12.0 file)")
    data = JOBSET_CRD.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    assert digest == JOBSET_CRD_SHA256, f"{JOBSET_CRD}: sha256 {digest} is not the published v0.12.0 CRD's"
    crd = yaml.safe_load(data)
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha2"]
    return strict_schema(version["schema"]["openAPIV3Schema"])


def strict_schema(node: Any) -> Any:
    """What the API server's structural pruning does, as errors: every object schema that lists its
    properties (and does not say x-kubernetes-preserve-unknown-fields) refuses other fields. The
    top-level `metadata` is ObjectMeta, which the API server validates itself (the tests check it with
    the Kubernetes schemas)."""
    if isinstance(node, list):
        return [strict_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: strict_schema(value) if key != "properties" else value for key, value in node.items()}
    if "properties" in node:
        out["properties"] = {name: strict_schema(sub) for name, sub in node["properties"].items()}
        if "additionalProperties" not in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    return out
