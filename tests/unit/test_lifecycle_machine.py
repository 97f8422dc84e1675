"""The lifecycle machine's one rule: the operations it may draw, and how a failure reads."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from oracle.lifecycle import MAX_AGENTS, LifecycleMachine
from substrat.orchestrator import Orchestrator
from tests.support.counterexamples import counterexample


@pytest.fixture
def machine() -> Iterator[LifecycleMachine]:
    made = LifecycleMachine()
    yield made
    made.teardown()


def test_the_first_step_creates_the_first_root(machine: LifecycleMachine) -> None:
    assert machine.operations() == ["create_root"]


def test_the_operations_are_those_valid_in_the_state(machine: LifecycleMachine) -> None:
    machine.create_root("ada")
    (ada,) = machine.agents
    assert sorted(machine.operations()) == sorted(
        [
            "run_turn",
            "create_root",
            "spawn_child",
            "send_message",
            "broadcast",
            "terminate_leaf",
            "run_pending",
            "evict",
            "reopen",
        ]
    )
    machine.spawn_child(ada, "bo")
    assert "terminate_cascade" in machine.operations()  # ada has a child now
    machine.terminate_cascade(ada)
    # no agent left, but there was one: what needs none
    assert machine.operations() == ["create_root", "run_pending", "reopen"]


def test_a_full_tree_takes_no_new_agent(machine: LifecycleMachine) -> None:
    machine.create_root("ada")
    (ada,) = machine.agents
    names = iter(f"kid{i}" for i in range(MAX_AGENTS))
    while len(machine.agents) < MAX_AGENTS:
        machine.spawn_child(ada, next(names))
    assert "create_root" not in machine.operations()
    assert "spawn_child" not in machine.operations()
    assert "run_turn" in machine.operations()


def test_a_step_that_writes_nothing_asks_no_conversation_again(
    machine: LifecycleMachine,
) -> None:
    machine.create_root("ada")
    (ada,) = machine.agents
    machine.run_turn(ada, "hello")
    machine.check_all()
    looked_up = machine.conversations.lookups
    machine.run_pending(max_turns=3, ack=False)  # no mail: nothing on the disk changes
    machine.check_all()
    assert machine.conversations.lookups == looked_up
    machine.run_turn(ada, "hello")  # the log grows: looked up again
    machine.check_all()
    assert machine.conversations.lookups == looked_up + 1


def test_a_turn_the_shadow_expects_and_the_log_lacks_fails_with_no_disk_change(
    machine: LifecycleMachine,
) -> None:
    """The skip of unchanged disks keys on the shadow's turns too: a turn that ran
    (by the shadow) but left nothing on the disk is still looked up, and fails."""
    machine.create_root("ada")
    (ada,) = machine.agents
    machine.run_turn(ada, "hello")
    machine.check_all()
    machine.agents[ada].turns += 1
    with pytest.raises(AssertionError):
        machine.conversations_are_whole()
    machine.agents[ada].turns -= 1  # the teardown's restart checks the truth again


def test_a_counterexample_shows_each_step_as_a_call(monkeypatch: pytest.MonkeyPatch) -> None:
    collect = Orchestrator.collect_user_inbox

    async def loses_the_oldest(self: Orchestrator) -> Any:
        got = await collect(self)
        return got[1:] if len(got) > 1 else got  # a planted bug

    monkeypatch.setattr(Orchestrator, "collect_user_inbox", loses_the_oldest)
    lines = counterexample(LifecycleMachine)
    calls = [line for line in lines if line.startswith("state.") and "(" in line]
    assert any(line.startswith("state.create_root(name='") for line in calls), lines
    assert any(line.startswith("state.run_pending(max_turns=") for line in calls), lines
    assert any("ack=True)" in line for line in calls), lines
    # the draws are not shown again as raw values (agent ids): the calls name the agents
    assert not any(line.startswith("Draw ") for line in lines), lines
    # each step is its call, once: no state.step(data=data(...)) a reader cannot replay
    assert not any(line.startswith("state.step(") for line in lines), lines
    program = [line for line in lines if line.startswith("state") and "matches_the" not in line]
    assert program[0] == "state = LifecycleMachine()", lines
    assert program[1].startswith("state.create_root(name='"), lines  # the first step, replayable
