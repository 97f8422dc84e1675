"""How long the daemon lets an agent whose woken turns fail rest (substrat.wakeloop)."""

from __future__ import annotations

import itertools

import pytest

from substrat.wakeloop import WAKE_REST_FIRST_S, WAKE_REST_MAX_S, WakePacer


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_rests_double_with_each_failure_up_to_the_cap() -> None:
    pacer = WakePacer(Clock())
    rests = [pacer.failed("a") for _ in range(16)]
    assert rests[:4] == [WAKE_REST_FIRST_S, 0.2, 0.4, 0.8]
    assert rests[-1] == WAKE_REST_MAX_S == 300.0
    assert all(b == min(WAKE_REST_MAX_S, 2 * a) for a, b in itertools.pairwise(rests))


def test_a_resting_agent_is_passed_over_until_its_rest_is_over() -> None:
    clock = Clock()
    pacer = WakePacer(clock)
    pacer.failed("a")
    pacer.failed("a")  # rests 0.2 s
    pacer.failed("b")  # rests 0.1 s
    assert pacer.resting() == {"a", "b"}
    assert pacer.next_wake_in() == pytest.approx(0.1)
    clock.now += 0.15
    assert pacer.resting() == {"a"}
    assert pacer.next_wake_in() == pytest.approx(0.05)
    clock.now += 0.1
    assert pacer.resting() == frozenset()
    # a rest that is over needs no waiting (an agent with nothing pending must not spin)
    assert pacer.next_wake_in() is None


def test_a_success_ends_the_streak() -> None:
    clock = Clock()
    pacer = WakePacer(clock)
    for _ in range(5):
        pacer.failed("a")
    pacer.succeeded("a")
    assert pacer.resting() == frozenset()
    assert pacer.failed("a") == WAKE_REST_FIRST_S
    pacer.succeeded("never-failed")  # nothing to end: no error
