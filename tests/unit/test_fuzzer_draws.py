"""The crash fuzzer's cheaper draws make the choices the strategies they replace made.

``oracle.machines.maybe_crash`` and ``oracle.draws.pick``/``integer``/``flag``
skip the spans a strategy's draw opens. They must still read the same choices
as ``st.none() | st.builds(CrashPlan, ...)``, ``st.sampled_from``,
``st.integers`` and ``st.booleans``, and give the same values from them: the
example corpus holds choice sequences, and a failing example replays from one.
Each check draws from random choices with one side and replays exactly those
choices on the other.
"""

from __future__ import annotations

from collections.abc import Callable
from random import Random
from typing import Any

import hypothesis
import pytest
from hypothesis import strategies as st
from hypothesis.reporting import with_reporter

from faultfs import MODES
from oracle.draws import ENGINE_CHOICES, flag, integer, pick
from oracle.machines import MAX_BOUNDARY, _maybe_crash_built, maybe_crash

try:  # Hypothesis's internals: what replaying a choice sequence takes
    from hypothesis.control import BuildContext
    from hypothesis.internal.conjecture.data import ConjectureData
    from hypothesis.strategies._internal.core import DataObject

    REPLAYS = callable(getattr(ConjectureData, "for_choices", None))
except ImportError:
    REPLAYS = False

pytestmark = pytest.mark.skipif(
    not (REPLAYS and ENGINE_CHOICES),
    reason=f"Hypothesis {hypothesis.__version__} "
    + (
        "draws no engine choices directly here (oracle.draws.ENGINE_CHOICES is off): "
        "the state machines draw through the strategies themselves, nothing to compare"
        if not ENGINE_CHOICES
        else "has no ConjectureData.for_choices to replay a choice sequence with: "
        "this check needs a Hypothesis whose internals it knows"
    ),
)

RUNS = 300


def _draw(data: ConjectureData, body: Callable[[DataObject], Any]) -> Any:
    with BuildContext(data, is_final=False, wrapped_test=lambda: None):
        return body(DataObject(data))


def _same_choices(before: Callable[[DataObject], Any], after: Callable[[DataObject], Any]) -> None:
    values = set()
    for first, second in ((before, after), (after, before)):
        for run in range(RUNS):
            drawn = ConjectureData(random=Random(run))
            value = _draw(drawn, first)
            choices = drawn.choices
            replayed = ConjectureData.for_choices(choices)
            assert _draw(replayed, second) == value, (run, choices)
            assert replayed.choices == choices, (run, choices)
            values.add(repr(value))
    assert len(values) > RUNS // 3, "the draws hardly vary: the check would see little"


def test_a_crash_plan_reads_the_choices_the_built_strategy_read() -> None:
    built = _maybe_crash_built()
    _same_choices(lambda data: data.draw(built), lambda data: data.draw(maybe_crash))


@pytest.mark.parametrize("count", [1, 2, 5])
def test_the_rules_draws_read_the_choices_their_strategies_read(count: int) -> None:
    items = [f"agent-{i}" for i in range(count)]

    def before(data: DataObject) -> tuple[Any, ...]:
        return (
            data.draw(st.sampled_from(items)),
            data.draw(st.integers(1, MAX_BOUNDARY)),
            data.draw(st.booleans()),
            data.draw(st.sampled_from(MODES)),
        )

    def after(data: DataObject) -> tuple[Any, ...]:
        return (
            pick(data, items, "agent"),
            integer(data, 1, MAX_BOUNDARY, "boundary"),
            flag(data, "written back"),
            pick(data, MODES, "mode"),
        )

    _same_choices(before, after)


def test_a_quiet_draw_reads_the_same_choices_and_shows_nothing_when_notes_print() -> None:
    items = [f"agent-{i}" for i in range(5)]
    shown: list[object] = []

    def noted(data: ConjectureData, body: Callable[[DataObject], Any]) -> Any:
        with BuildContext(data, is_final=True, wrapped_test=lambda: None):
            with with_reporter(shown.append):
                return body(DataObject(data))

    for run in range(RUNS):
        drawn = ConjectureData(random=Random(run))
        value = noted(drawn, lambda data: (pick(data, items, "agent"), flag(data, "ask")))
        assert len(shown) == 2  # a draw shown as usual, to compare with
        shown.clear()
        replayed = ConjectureData.for_choices(drawn.choices)
        quiet = noted(
            replayed,
            lambda data: (pick(data, items, "agent", quiet=True), flag(data, "ask", quiet=True)),
        )
        assert quiet == value and replayed.choices == drawn.choices, (run, drawn.choices)
        assert shown == []
