"""``AgentFacts.quiet`` builds what the dataclass's own ``__init__`` builds, field by field."""

from __future__ import annotations

import dataclasses

from substrat.facts import AgentFacts
from substrat.start_summary import facts_of

CREATED = {"agent_id": "a1", "name": "worker", "parent_session_id": None}


def test_quiet_is_the_dataclass_with_those_fields() -> None:
    quiet = AgentFacts.quiet("s1", dict(CREATED), 7, 2, 5, 120)
    built = AgentFacts(
        "s1",
        created=dict(CREATED),
        highest_turn=7,
        damaged_after=2,
        completed_turns=5,
        last_complete_seq=120,
    )
    assert type(quiet) is AgentFacts
    for f in dataclasses.fields(AgentFacts):  # every field, a new one too
        assert getattr(quiet, f.name) == getattr(built, f.name), f.name
        assert type(getattr(quiet, f.name)) is type(getattr(built, f.name)), f.name
    assert quiet == built


def test_quiet_facts_own_their_containers() -> None:
    """Recovery adds to a recipient's facts (a message rolled forward): no two agents'
    facts may share a map or a list."""
    one = AgentFacts.quiet("s1", dict(CREATED), 1, 0, 1, 3)
    two = AgentFacts.quiet("s2", dict(CREATED), 1, 0, 1, 3)
    for f in dataclasses.fields(AgentFacts):
        value = getattr(one, f.name)
        if isinstance(value, (dict, list, set)):
            assert value is not getattr(two, f.name), f.name
    one.enqueued["m1"] = {"message_id": "m1"}
    assert two.enqueued == {}


def test_a_summary_row_reads_as_the_quiet_facts() -> None:
    row = [dict(CREATED), 7, 2, 5, 120]
    assert facts_of("s1", row) == AgentFacts.quiet("s1", dict(CREATED), 7, 2, 5, 120)
