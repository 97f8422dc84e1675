"""The check of many pending messages at once is the check of each, message by message.

A restart checks every pending message a checkpoint holds (the user's thousands of
unread ones) with :meth:`MessageEnvelope.all_valid`, a field at a time over all of
them; whatever it gets, it answers what ``all(map(MessageEnvelope.is_valid, ...))``
answers: drawn messages with every field of every type JSON has (missing too), a
kind that cannot be hashed, and lists mixing good and bad ones.
"""

from __future__ import annotations

from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from substrat.agents import MESSAGE_KINDS, MessageEnvelope
from substrat.facts import AgentFacts

FIELDS = ("message_id", "sender", "recipient", "kind", "payload", "timestamp")
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=2), inner),
    max_leaves=4,
)
MISSING = object()


def good(i: int = 0) -> dict[str, Any]:
    return {
        "message_id": f"{i:032x}",
        "sender": "a",
        "recipient": "user",
        "kind": "result",
        "payload": "done",
        "timestamp": "2030-01-01T00:00:00.000000Z",
        "reply_to": None,
        "metadata": {"turn_id": "t1"},
    }


@st.composite
def messages(draw: st.DrawFn) -> Any:
    if draw(st.integers(0, 9)) == 0:
        return draw(JSON)  # not even an object
    message = good(draw(st.integers(0, 1 << 20)))
    for key in (*FIELDS, "reply_to", "metadata"):
        choice = draw(st.integers(0, 5))
        if choice == 0:
            value = draw(st.one_of(JSON, st.just(MISSING)))
            if value is MISSING:
                del message[key]
            else:
                message[key] = value
        elif choice == 1 and key == "kind":
            message[key] = draw(st.sampled_from([*sorted(MESSAGE_KINDS), "future", ["result"]]))
        elif choice == 1 and key in ("reply_to", "metadata"):
            message[key] = draw(st.sampled_from([None, "", 0, [], {}, "x", {"k": 1}]))
    return message


@given(st.lists(messages(), max_size=6))
@example([])
@example([good(), {**good(1), "kind": ["result"]}])  # an unhashable kind: no kind, no raise
@example([good(), {**good(1), "metadata": ""}])  # a falsy metadata reads as none
@example([good(), {k: v for k, v in good(2).items() if k != "reply_to"}])
def test_many_at_once_answer_as_each_alone(batch: list[Any]) -> None:
    assert MessageEnvelope.all_valid(batch) == all(map(MessageEnvelope.is_valid, batch))


def test_a_batch_of_good_messages_is_valid_and_one_bad_field_is_not() -> None:
    batch = [good(i) for i in range(50)]
    assert MessageEnvelope.all_valid(batch)
    for key, bad in [(f, 7) for f in FIELDS] + [("reply_to", 7), ("metadata", "x")]:
        spoiled = [*batch[:20], {**batch[20], key: bad}, *batch[21:]]
        assert not MessageEnvelope.all_valid(spoiled), key
        assert not MessageEnvelope.is_valid(spoiled[20]), key


def test_a_logged_message_whose_kind_cannot_be_hashed_is_unreadable_not_an_error() -> None:
    """A checksummed ``message.enqueued`` whose kind is a list: ``is_valid`` raised
    TypeError on it, out of the read of the log (a start stopped there); it is counted
    as an unreadable message, as any other kind this version cannot deliver."""
    facts = AgentFacts("s")
    data = {**good(), "kind": ["result"]}
    facts.add({"seq": 1, "event": "message.enqueued", "data": data})
    assert not facts.enqueued
    assert facts.damage == {"unreadable_message": 1}
