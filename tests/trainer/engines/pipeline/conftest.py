"""Pipeline tests share two cores with other work: one intra-op thread, no denormal slowdowns."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _one_thread_no_denormals() -> None:
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
