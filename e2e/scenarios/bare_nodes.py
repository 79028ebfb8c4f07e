"""The bare-node recipe (`docker run` on three machines, no Kubernetes) of docs/deploy-bare-nodes.md,
run as written.

The recipe is read from that page, not copied here: the scenario fails when the page's recipe does.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from maskrcnn_dist.run_dir import METRICS_FILE

from .. import checks
from ..checks import Failed, require
from ..cluster import DockerError
from .chart import ROOT
from .common import Settings
from .deployment import Deployment

#: The page users copy the recipe from.
RECIPE_PAGE = ROOT / "docs" / "deploy-bare-nodes.md"


def extract_recipe(page: Path = RECIPE_PAGE) -> tuple[str, Path]:
    """The fenced block after `<!-- e2e: bare-nodes -->` in the page: the recipe users copy."""
    m = re.search(r"<!-- e2e: bare-nodes -->\s*```(?:bash|sh)?\n(.*?)```", page.read_text(), re.S)
    if not m:
        raise Failed(f"no '<!-- e2e: bare-nodes -->' recipe block in {page}")
    return m.group(1), page


def set_site_variables(recipe: str, site: dict[str, str]) -> str:
    """What a user edits before running the recipe: the values of its `VAR=...` lines, nothing else."""
    for key, value in site.items():
        recipe, count = re.subn(rf"(?m)^{key}=\S*", lambda _m, k=key, v=value: f"{k}={shlex.quote(v)}", recipe)
        require(count == 1, f"the recipe should set {key} once at the start of a line (found {count})")
    return recipe


def name_containers(recipe: str, prefix: str) -> tuple[str, list[str]]:
    """The recipe with each of its `--name`s (and every later use of it) prefixed: docker's container
    names are global, and another harness run may be running this recipe too. The new names."""
    names = re.findall(r"--name\s+(\S+)", recipe)
    for name in names:
        recipe = re.sub(rf"(?<![\w.-]){re.escape(name)}(?![\w.-])", f"{prefix}{name}", recipe)
    return recipe, [f"{prefix}{name}" for name in names]


def scenario_bare_nodes(settings: Settings) -> dict[str, Any]:
    """The docs' `docker run` recipe for three bare nodes, run as written; the docker network
    stands in for the hosts' network (NET), container names (made unique) for host names (MASTER)."""
    recipe, source = extract_recipe()
    steps = int(re.search(r"--max-steps\s+(\d+)", recipe).group(1))
    with Deployment(settings, "bare-nodes") as d:
        recipe, names = name_containers(recipe, f"e2e-{d.run_id}-")
        require(len(names) == 3, f"the recipe in {source} should start 3 named containers, found {names}")
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
