"""The published API schemas of schemas/ for the tests: each file's bytes checked against the sha256
its README records, and a CRD's schema made as strict as the API server's structural pruning."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
# Published API schemas, kept as published, with their provenance and sha256 in the README's table.
SCHEMAS = ROOT / "schemas"


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


def crd_schema(path: Path, version: str) -> dict[str, Any]:
    """The openAPIV3Schema of `version` of the published CRD at `path`, made strict (strict_schema)."""
    crd = published_schema(path)
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return strict_schema(served["schema"]["openAPIV3Schema"])


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
