"""Fixtures for the chart tests: helm runs, rendered objects, scenario values and the JobSet schema.

The `helm` binary is tests/conftest.py's fixture. Every scenario is rendered twice: as for a cluster
without JobSet, and as for one that serves `jobset.x-k8s.io/v1alpha2` (`--api-versions`), where
`workload: auto` renders a JobSet.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from maskrcnn_launcher.yamlfile import load_yaml_all

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm"
RELEASE = "t"
JOBSET_API = "jobset.x-k8s.io/v1alpha2"
# Published API schemas, kept as published, with their provenance and sha256 in the README's table.
SCHEMAS = ROOT / "schemas"
# The JobSet CRD of kubernetes-sigs/jobset v0.12.0, which every rendered JobSet is validated against.
JOBSET_CRD = SCHEMAS / "jobset.x-k8s.io_jobsets-v0.12.0.yaml"
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


# A row of schemas/README.md's table: | `file` | what | project | tag | path | licence | `sha256` |
SCHEMA_ROW = re.compile(r"^\| `(?P<file>[^`]+)` \|.*\| `(?P<sha256>[0-9a-f]{64})` \|$", re.MULTILINE)


def recorded_schemas() -> dict[str, str]:
    """schemas/README.md's table: file name -> the sha256 recorded for it."""
    return {m["file"]: m["sha256"] for m in SCHEMA_ROW.finditer((SCHEMAS / "README.md").read_text())}


def published_schema(path: Path) -> Any:
    """A file of schemas/, parsed, once its bytes are checked against the sha256 the README records
    (an edited file cannot pass for the published one)."""
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    recorded = recorded_schemas().get(path.name)
    assert digest == recorded, f"{path}: sha256 {digest}, schemas/README.md records {recorded}"
    return yaml.safe_load(data)


@pytest.fixture(scope="session")
def jobset_schema() -> dict[str, Any]:
    """The CRD's v1alpha2 openAPIV3Schema, made strict: a field it does not name is an error."""
    crd = published_schema(JOBSET_CRD)
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
