"""oracle.engine_floor: a machine's rules with empty bodies, for the engine's own cost."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from oracle.engine_floor import INITIAL_RULE, INVARIANT, RULE, engine_only
from oracle.lifecycle import LifecycleMachine


def shape(machine: type) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Each decorated function's kind and argument names."""
    found: dict[str, tuple[str, tuple[str, ...]]] = {}
    for name, function in inspect.getmembers(machine, inspect.isfunction):
        for kind in (RULE, INITIAL_RULE):
            if (marker := getattr(function, kind, None)) is not None:
                found[name] = (kind, tuple(sorted(marker.arguments)))
        if getattr(function, INVARIANT, None) is not None:
            found[name] = (INVARIANT, ())
    return found


def test_the_lifecycle_machine_keeps_its_rules_and_arguments() -> None:
    original = shape(LifecycleMachine)
    assert original == {"step": (RULE, ("data",))}  # its checks run inside the step
    assert shape(engine_only(LifecycleMachine)) == original


def test_initial_rules_rules_and_invariants_keep_their_arguments() -> None:
    class Three(RuleBasedStateMachine):
        @initialize(first=st.integers(0, 3))
        def start(self, first: int) -> None:
            pass

        @rule(value=st.integers(0, 9), flag=st.booleans())
        def step(self, value: int, flag: bool) -> None:
            pass

        @invariant()
        def holds(self) -> None:
            pass

    assert (
        shape(engine_only(Three))
        == shape(Three)
        == {
            "start": (INITIAL_RULE, ("first",)),
            "step": (RULE, ("flag", "value")),
            "holds": (INVARIANT, ()),
        }
    )


def test_the_bodies_are_empty_and_the_engine_still_runs_them() -> None:
    calls: list[int] = []

    class Counting(RuleBasedStateMachine):
        @rule(value=st.integers(0, 9))
        def step(self, value: int) -> None:
            calls.append(value)

    run_state_machine_as_test(
        engine_only(Counting),
        settings=settings(
            max_examples=5,
            stateful_step_count=5,
            database=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
    assert calls == []
    run_state_machine_as_test(
        Counting,
        settings=settings(max_examples=5, stateful_step_count=5, database=None),
    )
    assert calls  # the same machine, not emptied, does run its body


def test_a_machine_without_readable_rules_is_refused_with_what_to_do() -> None:
    class NoRules(RuleBasedStateMachine):
        def step(self) -> Any:
            return None

    with pytest.raises(TypeError, match=r"update oracle/engine_floor\.py"):
        engine_only(NoRules)
