"""Fixtures for the chart tests: a helm binary (fetched when none is installed) and rendered objects.

helm comes from PATH, else from .tools/ (where `make helm` puts it), else helm/hack/get-helm.sh
fetches the pinned one now: a missing helm is a failure with a reason, never a silent skip.
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

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm"
TOOLS = ROOT / ".tools"
RELEASE = "t"
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


@pytest.fixture(scope="session")
def render(run_helm) -> Callable[..., list[dict[str, Any]]]:
    """render(scenario, *--set items) -> the rendered objects (helm test hooks included), cached."""
    cache: dict[tuple[str, tuple[str, ...]], list[dict[str, Any]]] = {}

    def _render(scenario: str, *sets: str) -> list[dict[str, Any]]:
        key = (scenario, sets)
        if key not in cache:
            proc = run_helm("template", RELEASE, str(CHART), *values_args(SCENARIOS[scenario], sets))
            assert proc.returncode == 0, f"helm template {scenario} {sets} failed:\n{proc.stderr}"
            cache[key] = [doc for doc in yaml.safe_load_all(proc.stdout) if doc]
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
