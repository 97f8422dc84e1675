"""Agents in memory: names, messages, inboxes and the tree."""

from __future__ import annotations

import json
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from substrat.agents import (
    MAX_NAME_CHARS,
    USER,
    AgentNode,
    AgentTree,
    Inbox,
    InboxRegistry,
    MessageEnvelope,
    validate_name,
)
from substrat.errors import AgentNotFoundError, NameCollisionError
from substrat.eventlog import check_plain_json


def node(agent_id: str, name: str, parent: str | None = None) -> AgentNode:
    return AgentNode(agent_id, f"s-{agent_id}", name, parent, "", "scripted", "directives")


def message(message_id: str, recipient: str = "r", kind: str = "notification") -> MessageEnvelope:
    return MessageEnvelope(message_id, "s", recipient, kind, f"payload {message_id}", "2030")


@pytest.mark.parametrize("name", ["a", "A1", "worker_2", "x.y-z", "9lives", "n" * MAX_NAME_CHARS])
def test_valid_names(name: str) -> None:
    assert validate_name(name) == name


@pytest.mark.parametrize(
    "name",
    ["", "-a", ".a", "_a", "a/b", "a b", "é", "n" * (MAX_NAME_CHARS + 1), None, 3, USER, "parent"],
)
def test_invalid_names_say_what_is_allowed(name: object) -> None:
    with pytest.raises(ValueError, match=r"letters, digits|reserved"):
        validate_name(name)


def test_envelope_round_trips_as_plain_json() -> None:
    original = MessageEnvelope(
        "m1", "a", USER, "reply", "hi\nthere", "2030-01-01T00:00:00+00:00", "m0", {"turn_id": "t3"}
    )
    data = original.to_dict()
    check_plain_json(data)
    assert MessageEnvelope.from_dict(json.loads(json.dumps(data))) == original
    data["metadata"]["turn_id"] = "changed"
    assert original.metadata == {"turn_id": "t3"}  # to_dict copies


def test_inbox_claim_release_remove() -> None:
    inbox = Inbox()
    assert inbox.deliver(message("m1"), 5) and inbox.deliver(message("m2"), 3)
    assert not inbox.deliver(message("m1"), 9)  # re-delivery is a no-op
    assert [m.message_id for m in inbox.pending()] == ["m2", "m1"]  # by order, not arrival
    assert inbox.oldest_pending_order() == 3
    assert [m.message_id for m in inbox.claim("t1")] == ["m2", "m1"]
    assert inbox.pending() == [] and inbox.oldest_pending_order() is None
    assert len(inbox) == 2 and "m1" in inbox  # claimed messages are still here
    inbox.deliver(message("m3"), 7)
    assert [m.message_id for m in inbox.claim("t2")] == ["m3"]
    inbox.release("t1")
    assert [m.message_id for m in inbox.pending()] == ["m2", "m1"]
    inbox.remove(["m2", "m3", "absent"])
    assert [m.message_id for m in inbox.all()] == ["m1"]
    assert "m3" not in inbox
    inbox.release("t2")  # releasing a claim on a removed message is harmless
    assert [m.message_id for m in inbox.pending()] == ["m1"]


def test_registry_orders_arrivals_across_inboxes() -> None:
    registry = InboxRegistry()
    registry.deliver(message("m1", "b"))
    registry.deliver(message("m2", "a"))
    registry.deliver(message("m3", "b"))
    assert registry.inbox("a").oldest_pending_order() == 1
    assert registry.inbox("b").oldest_pending_order() == 0
    assert sorted(registry.endpoints()) == ["a", "b"]
    registry.drop("b")
    assert registry.endpoints() == ["a"]
    assert len(registry.inbox("b")) == 0  # a dropped endpoint comes back empty


def test_an_inbox_delivered_data_holds_what_one_delivered_envelopes_holds() -> None:
    """A start delivers its messages as their envelopes' data, built when the inbox is
    first read: every question the inbox answers is answered alike, before and after."""
    datas = [
        message("m1").to_dict(),
        {**message("m2", kind="reply").to_dict(), "reply_to": "m0", "metadata": {"t": "3"}},
        message("m3").to_dict(),
    ]
    eager, lazy = InboxRegistry(), InboxRegistry()
    for data in datas:
        assert eager.deliver(MessageEnvelope.from_dict(data))
        assert lazy.deliver_data(data)
    assert not lazy.deliver_data(datas[0]) and not lazy.deliver(message("m1"))
    assert not eager.deliver(message("m1"))
    one, other = eager.inbox("r"), lazy.inbox("r")
    assert len(other) == len(one) == 3 and "m2" in other and "m9" not in other
    other.remove(["m3"])
    one.remove(["m3"])
    assert "m3" not in other and len(other) == 2
    assert other.oldest_pending_order() == one.oldest_pending_order() == 0
    assert other.all() == one.all() and other.pending() == one.pending()
    assert [m.metadata for m in other.all()] == [{}, {"t": "3"}]
    assert other.claim("t1") == one.claim("t1")
    lazy.deliver(message("m4"))  # a live delivery after the start's: the order goes on
    eager.deliver(message("m4"))
    assert other.pending() == one.pending() == [message("m4")]


def build_tree() -> AgentTree:
    tree = AgentTree()
    tree.add(node("r1", "alpha"))
    tree.add(node("r2", "beta"))
    tree.add(node("c1", "worker", "r1"))
    tree.add(node("c2", "helper", "r1"))
    tree.add(node("g1", "worker", "c1"))  # the same name one level down is fine
    tree.add(node("c3", "worker", "r2"))  # and under another parent
    return tree


def test_tree_paths_resolution_and_order() -> None:
    tree = build_tree()
    tree.check()
    assert [n.agent_id for n in tree.roots()] == ["r1", "r2"]
    assert [n.agent_id for n in tree.children("r1")] == ["c2", "c1"]  # by name
    assert [n.agent_id for n in tree.walk()] == ["r1", "c2", "c1", "g1", "r2", "c3"]
    assert tree.path("g1") == "alpha/worker/worker"
    assert tree.resolve("alpha/worker/worker").agent_id == "g1"
    assert tree.resolve("/beta/worker/").agent_id == "c3"
    assert tree.resolve("c2").agent_id == "c2"
    assert [n.agent_id for n in tree.siblings("c1")] == ["c2"]
    assert [n.agent_id for n in tree.siblings("r1")] == ["r2"]
    assert [n.agent_id for n in tree.subtree_leaves_first("r1")] == ["c2", "g1", "c1", "r1"]
    assert tree.by_session("s-g1") is tree.get("g1")
    assert tree.by_session("nope") is None
    assert len(tree) == 6 and "g1" in tree and "zz" not in tree


def test_nodes_are_every_live_agent_as_walk_has_them() -> None:
    tree = build_tree()
    tree.remove("g1")
    tree.add(node("c4", "late", "r1"))  # added after its parent's other children
    walked = [n.agent_id for n in tree.walk()]
    assert walked == ["r1", "c2", "c4", "c1", "r2", "c3"]
    nodes = tree.nodes()
    assert sorted(n.agent_id for n in nodes) == sorted(walked)
    assert all(n is tree.get(n.agent_id) for n in nodes)


def test_in_walk_order_is_walks_order_of_the_agents_asked_for() -> None:
    tree = build_tree()
    # a name that sorts between a name and that name's children as a whole path would
    # ("a-b" < "a/b" as text): the order is name by name, as walk has it
    tree.add(node("x1", "a"))
    tree.add(node("x2", "b", "x1"))
    tree.add(node("x3", "a-b"))
    tree.add(node("x4", "a-c", "x1"))
    walked = [n.session_id for n in tree.walk()]
    assert [n.session_id for n in tree.in_walk_order(set(walked))] == walked
    some = {"s-x3", "s-g1", "s-x2", "s-r2", "nobody"}
    assert [n.session_id for n in tree.in_walk_order(some)] == [s for s in walked if s in some]
    assert tree.in_walk_order(set()) == []


_TRICKY = ["a", "a-b", "a-c", "a0", "a00", "a.1", "a_1", "b", "c1", "c01", "c2", "c10", "0", "9z"]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(_TRICKY), st.integers(min_value=-1, max_value=30))),
    st.data(),
)
def test_in_walk_order_is_walks_order_for_any_tree(
    adds: list[tuple[str, int]], data: st.DataObject
) -> None:
    """Names whose natural keys are equal (``c01``, ``c1``; ``a0``, ``a00``), a prefix of
    each other or of a sibling's path: in_walk_order of any set is walk's order of it."""
    tree = AgentTree()
    ids: list[str] = []
    for name, parent in adds:
        parent_id = ids[parent] if 0 <= parent < len(ids) else None
        agent_id = f"x{len(ids)}"
        if tree.name_taken(parent_id, name):
            continue
        tree.add(node(agent_id, name, parent_id))
        ids.append(agent_id)
    walked = [n.session_id for n in tree.walk()]
    some = set(data.draw(st.lists(st.sampled_from(walked))) if walked else [])
    assert [n.session_id for n in tree.in_walk_order(set(walked))] == walked
    assert [n.session_id for n in tree.in_walk_order(some)] == [s for s in walked if s in some]


@pytest.mark.parametrize("ref", ["", "/", "gamma", "alpha/nobody", "alpha/worker/worker/deeper"])
def test_unknown_agents_raise_with_a_hint(ref: str) -> None:
    with pytest.raises(AgentNotFoundError, match="no live agent"):
        build_tree().resolve(ref)


def test_names_are_unique_among_siblings_only() -> None:
    tree = build_tree()
    with pytest.raises(NameCollisionError, match="pick another name"):
        tree.add(node("x", "alpha"))
    with pytest.raises(NameCollisionError):
        tree.add(node("y", "helper", "r1"))
    with pytest.raises(ValueError, match="already in the tree"):
        tree.add(node("c1", "fresh", "r2"))
    with pytest.raises(ValueError, match="invalid agent name"):
        tree.add(node("z", "bad name"))
    assert len(tree) == 6
    tree.check()


def test_remove_leaves_and_refuse_parents() -> None:
    tree = build_tree()
    with pytest.raises(AssertionError, match="has children"):
        tree.remove("c1")
    tree.remove("g1")
    tree.remove("c1")
    assert tree.name_taken("r1", "helper") and not tree.name_taken("r1", "worker")
    tree.add(node("c4", "worker", "r1"))  # the name is free again
    assert tree.resolve("alpha/worker").agent_id == "c4"
    assert tree.by_session("s-c1") is None
    tree.check()
    with pytest.raises(AgentNotFoundError):
        tree.get("c1")


def test_check_catches_a_broken_link() -> None:
    tree = build_tree()
    tree.get("c1").name = "renamed"  # the parent's index still says "worker"
    with pytest.raises(AssertionError):
        tree.check()


def test_in_walk_order_of_a_tree_deeper_than_the_recursion_limit() -> None:
    tree = AgentTree()
    parent = None
    for depth in range(sys.getrecursionlimit() + 100):
        tree.add(node(f"d{depth}", f"n{depth}", parent))
        parent = f"d{depth}"
    walked = [n.session_id for n in tree.walk()]
    some = set(walked[::7])
    assert [n.session_id for n in tree.in_walk_order(some)] == [s for s in walked if s in some]
