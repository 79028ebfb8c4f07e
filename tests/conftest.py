"""Fixtures shared by every test folder."""

from __future__ import annotations

import pytest
from maskrcnn_launcher.peers import free_port as pick_free_port


@pytest.fixture
def free_port() -> int:
    """A loopback TCP port that is free right now: the launcher's own `peers.free_port` (the one
    `maskrcnn-launch local` uses), so tests and the launcher pick ports the same way. It is released
    before the test binds it: see that function for the small race this leaves."""
    return pick_free_port()
