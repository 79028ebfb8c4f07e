"""Fixtures for the chart tests: helm runs, rendered objects, scenario values and the JobSet schema.

The `helm` binary is tests/conftest.py's fixture. Every scenario is rendered twice: as for a cluster
without JobSet, and as for one that serves `jobset.x-k8s.io/v1alpha2` (`--api-versions`), where
`workload: auto` renders a JobSet.
"""

from __future__ import annotations

import itertools
import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from maskrcnn_launcher.yamlfile import load_yaml_all
from published_schemas import SCHEMAS, crd_schema, published_schema, recorded_schemas, strict_schema

__all__ = ["SCHEMAS", "published_schema", "recorded_schemas", "strict_schema"]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm"
RELEASE = "t"
JOBSET_API = "jobset.x-k8s.io/v1alpha2"
# The JobSet CRD of kubernetes-sigs/jobset v0.12.0, which every rendered JobSet is validated against.
JOBSET_CRD = SCHEMAS / "jobset.x-k8s.io_jobsets-v0.12.0.yaml"
# The Kubeflow Trainer v2.3.0 CRDs (API trainer.kubeflow.org/v1alpha1), by kind: the training runtime and
# its TrainJob are validated against them.
TRAINER_CRDS = {
    kind: SCHEMAS / f"trainer.kubeflow.org_{kind.lower()}s-v2.3.0.yaml"
    for kind in ("TrainJob", "TrainingRuntime", "ClusterTrainingRuntime")
}
# Scenario name -> values file (None: the chart's defaults, which k8s/ is rendered from).
SCENARIOS: dict[str, Path | None] = {
    "default": None,
    **{p.name.removesuffix("-values.yaml"): p for p in sorted((CHART / "ci").glob("*-values.yaml"))},
}


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


@pytest.fixture
def template_values(run_helm, tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """template_values(values, *helm args) -> `helm template` of the chart with `values` (a mapping,
    written as a JSON values file, so a string stays a string and a number a number: YAML would read
    an unquoted 1e3 as 1000) over its defaults."""
    files = itertools.count()

    def run(values: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
        path = tmp_path / f"values-{next(files)}.yaml"
        path.write_text(json.dumps(values))
        return run_helm("template", RELEASE, str(CHART), "-f", str(path), *args)

    return run


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
def trainer_schemas() -> dict[str, dict[str, Any]]:
    """Kind -> the Trainer CRD's v1alpha1 openAPIV3Schema, made strict."""
    return {kind: crd_schema(path, "v1alpha1") for kind, path in TRAINER_CRDS.items()}


@pytest.fixture(scope="session")
def jobset_schema() -> dict[str, Any]:
    """The CRD's v1alpha2 openAPIV3Schema, made strict: a field it does not name is an error."""
    return crd_schema(JOBSET_CRD, "v1alpha2")
