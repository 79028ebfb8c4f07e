"""The elastic group's policy (lifetime/membership.py): pure functions of what the leader has seen, without
a store or a process: who stays, who joins, at which boundary, and whether a small group goes on."""

from __future__ import annotations

import pytest

from maskrcnn_dist.lifetime.membership import (
    ElasticPolicy,
    Hold,
    admissions,
    admits_at,
    after_waiting,
    enough,
    next_members,
    stays,
)

POLICY = ElasticPolicy(dead_after_s=2.0, min_size=3, min_wait_s=60.0)


@pytest.mark.parametrize(
    ("answered", "gone", "silent_s", "verdict"),
    [
        (True, False, 0.0, True),  # it said it is still here
        (True, False, 9.0, True),  # ... even if its beat lags: it answered
        (False, True, 0.0, False),  # drained at the boundary
        (False, False, 2.5, False),  # its heartbeat stopped: lost
        (False, False, 1.0, None),  # neither yet: wait
    ],
)
def test_who_stays_in_the_next_generation(answered: bool, gone: bool, silent_s: float, verdict: bool | None) -> None:
    assert stays(answered, gone, silent_s, POLICY) is verdict


def test_each_launch_rank_joins_once_by_its_newest_ticket() -> None:
    """Ticket 3 and 5 are both member 2's (replaced again before its first replacement was admitted): the
    newest is admitted, the older refused; member 4 (ticket 4) died while it waited; member 1 is still a
    member (its old process not yet counted lost), so its ticket waits."""
    decided = admissions({3: 2, 4: 4, 5: 2, 6: 1}, beating={3, 5, 6}, members=[0, 1])
    assert decided.admit == {5: 2}
    assert set(decided.refuse) == {3, 4}
    assert "asked again" in decided.refuse[3] and "silent" in decided.refuse[4]
    assert decided.wait == {6: 1}


def test_a_ticket_is_answered_once() -> None:
    """An admitted ticket leaves the leader's hand: the same id's next request is a new ticket."""
    first = admissions({1: 2}, beating={1}, members=[0, 1])
    assert first.admit == {1: 2} and not first.wait
    second = admissions({7: 2}, beating={7}, members=[0, 1])  # replaced again after it had joined and left
    assert second.admit == {7: 2}


def test_no_newcomer_is_admitted_after_the_last_step() -> None:
    assert admits_at(after_step=5, total_steps=8)
    assert admits_at(after_step=7, total_steps=8)
    assert not admits_at(after_step=8, total_steps=8)


def test_a_group_below_its_minimum_holds_then_goes_on_or_stops() -> None:
    assert enough(3, POLICY) and not enough(2, POLICY)
    assert enough(1, ElasticPolicy())  # the default minimum: any survivor trains on
    assert after_waiting(3, 0.0, POLICY) is Hold.GO_ON
    assert after_waiting(4, 120.0, POLICY) is Hold.GO_ON  # enough even after the wait
    assert after_waiting(2, 59.0, POLICY) is Hold.WAIT
    assert after_waiting(2, 60.0, POLICY) is Hold.STOP


def test_the_leader_first_then_launch_rank_order() -> None:
    assert next_members(staying=[2, 0], joiners=[1]) == (0, 1, 2)
    assert next_members(staying=[0], joiners=[]) == (0,)
