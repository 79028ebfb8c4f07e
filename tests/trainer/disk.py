"""Keeping a test session's disk use small.

CI runs the suite on a machine whose disk is shared with the image build that follows, and a
checkpoint of the small test model is ~240 MB. pytest removes a passing test's `tmp_path` at once
(`tmp_path_retention_policy = "failed"` in pyproject.toml), but a folder from `tmp_path_factory`
lives until the session ends, so a module- or package-scoped run drops its checkpoints itself when
its scope ends. Its logs and metrics stay, for reading after a failure."""

from __future__ import annotations

from pathlib import Path


def drop_checkpoints(root: Path) -> None:
    """Delete every PyTorch file under root (checkpoints, best.pt, torch.save's temporary files)."""
    for path in root.rglob("*"):
        if path.is_file() and (path.suffix == ".pt" or ".pt.tmp" in path.name):
            path.unlink(missing_ok=True)
