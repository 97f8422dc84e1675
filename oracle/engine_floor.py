"""A state machine's rules with empty bodies: what the Hypothesis engine alone costs.

The lifecycle fuzzer's target (issue 17: at least 125 examples of 30 steps per
CPU second) is a budget for everything in an example: the engine choosing
rules and drawing their arguments, the operations on the orchestrator, the
checks after each step, set-up and teardown. :func:`engine_only` keeps a
machine's rule names, initial rules, invariants and argument strategies and
drops the rest (bodies, preconditions, state), so running it measures the
engine's own share of that budget. Without preconditions the engine has less
to filter, so the figure is a ceiling: no change to the machine's bodies can
make the fuzzer faster than this.

Rules are read through the markers that Hypothesis's ``@rule``,
``@initialize`` and ``@invariant`` decorators set on a function (its own
collection in ``RuleBasedStateMachine`` reads the same attributes); if a
Hypothesis release renames them, :func:`engine_only` finds no rule and says so.
"""

from __future__ import annotations

import inspect
from typing import Any

from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

RULE = "hypothesis_stateful_rule"
INITIAL_RULE = "hypothesis_stateful_initialize_rule"
INVARIANT = "hypothesis_stateful_invariant"


def _empty(name: str) -> Any:
    def body(self: RuleBasedStateMachine, **arguments: Any) -> None:
        return None

    body.__name__ = body.__qualname__ = name
    return body


def engine_only(machine: type[RuleBasedStateMachine]) -> type[RuleBasedStateMachine]:
    """A machine with ``machine``'s rules and argument strategies, and empty bodies."""
    namespace: dict[str, Any] = {}
    for name, function in inspect.getmembers(machine, inspect.isfunction):
        if (found := getattr(function, RULE, None)) is not None:
            namespace[name] = rule(**found.arguments)(_empty(name))
        elif (found := getattr(function, INITIAL_RULE, None)) is not None:
            namespace[name] = initialize(**found.arguments)(_empty(name))
        elif getattr(function, INVARIANT, None) is not None:
            namespace[name] = invariant()(_empty(name))
    if not any(getattr(f, RULE, None) for f in namespace.values()):
        raise TypeError(
            f"{machine.__name__} has no rule this module can read: Hypothesis may have "
            f"renamed the {RULE!r} marker; update oracle/engine_floor.py"
        )
    return type(f"{machine.__name__}EngineOnly", (RuleBasedStateMachine,), namespace)
