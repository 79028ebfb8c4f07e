"""The mutation list (tests/hack/mutations.py) stays true to the code: each break's text is still in its
file exactly once, and the tests named to catch it still exist. Read only: nothing is applied here (a
mutation written into src/ would reach the tests running beside this one)."""

from __future__ import annotations

import pytest
from hack import mutations


@pytest.mark.parametrize("mutation", mutations.MUTATIONS, ids=lambda m: m.name)
def test_each_mutation_still_fits_the_code(mutation: mutations.Mutation) -> None:
    assert mutations.stale(mutation) == []


def test_a_moved_text_is_named_as_stale() -> None:
    moved = mutations.Mutation(
        "moved", (("src/maskrcnn_dist/run_lock.py", "no such text", "x"),), ("tests/nowhere.py",)
    )
    assert mutations.stale(moved) == [
        "src/maskrcnn_dist/run_lock.py: the text to break is there 0 times, not once: 'no such text'",
        "tests/nowhere.py: no such test file",
    ]
