"""schemas/: the published API schemas the renders are validated against, kept as published.

Every file has its row in schemas/README.md (project, tag, path, licence, sha256), its bytes are the
ones recorded there, and its licence text is beside it.
"""

from __future__ import annotations

import hashlib
import re

from .conftest import JOBSET_CRD, SCHEMAS, published_schema, recorded_schemas


def test_every_schema_is_recorded_with_its_sha256() -> None:
    files = {p.name for p in SCHEMAS.iterdir() if p.name != "README.md" and not p.name.startswith("LICENSE")}
    recorded = recorded_schemas()
    assert JOBSET_CRD.name in recorded
    assert files == set(recorded), "schemas/ and the table in schemas/README.md list other files"
    for name, sha256 in recorded.items():
        assert hashlib.sha256((SCHEMAS / name).read_bytes()).hexdigest() == sha256, f"schemas/{name} was changed"


def test_every_schema_names_its_licence_and_the_text_is_there() -> None:
    readme = (SCHEMAS / "README.md").read_text()
    rows = [line for line in readme.splitlines() if line.startswith("| `")]
    assert len(rows) == len(recorded_schemas())
    for row in rows:
        (licence,) = re.findall(r"\[`(LICENSE-[\w.-]+)`\]", row)
        assert (SCHEMAS / licence).read_text().lstrip().startswith("Apache License"), licence


def test_the_jobset_crd_is_the_published_v0_12_0() -> None:
    crd = published_schema(JOBSET_CRD)
    assert crd["kind"] == "CustomResourceDefinition" and crd["metadata"]["name"] == "jobsets.jobset.x-k8s.io"
    assert [v["name"] for v in crd["spec"]["versions"]] == ["v1alpha2"]
