"""A state machine's counterexample, as Hypothesis prints it, for tests of how it reads."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test


def counterexample(machine: type[RuleBasedStateMachine]) -> list[str]:
    """The lines Hypothesis notes on the first failing example ``machine`` finds (it
    must find one: a test plants the failure)."""
    with pytest.raises(AssertionError) as failure:
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=200,
                derandomize=True,
                database=None,
                deadline=None,
                phases=[Phase.generate],  # shrinking would take minutes
                suppress_health_check=list(HealthCheck),
            ),
        )
    notes: list[str] = getattr(failure.value, "__notes__", [])
    return notes
