"""LazyDict behaves as the dict of every value built, and builds only what is asked for."""

from __future__ import annotations

import copy
import json
import pickle
from collections.abc import Callable
from typing import Any

import pytest

from substrat.agents import AgentNode, AgentTree
from substrat.errors import NameCollisionError
from substrat.lazy import LazyDict


def _lazy(built: list[str]) -> LazyDict[str, int]:
    """Keys a, b built (1, 2); c, d, e rows (built as 10 times their source)."""

    def build(key: str, source: int) -> int:
        built.append(key)
        return source * 10

    return LazyDict({"a": 1, "b": 2}, {"c": 3, "d": 4, "e": 5}, build)


EAGER = {"a": 1, "b": 2, "c": 30, "d": 40, "e": 50}


def test_a_key_is_there_and_counted_before_it_is_built() -> None:
    built: list[str] = []
    d = _lazy(built)
    assert len(d) == 5 and "c" in d and "z" not in d and bool(d)
    assert d.unbuilt() == 3 and d.is_source("c") and not d.is_source("a")
    assert sorted(d.all_keys()) == sorted(EAGER) and d.built_keys() == ["a", "b"]
    assert d.source("c") == 3 and d.source("a") is None
    assert built == []


def test_reading_one_value_builds_that_one() -> None:
    built: list[str] = []
    d = _lazy(built)
    assert d["c"] == 30 and d.get("d") == 40 and d.get("z", -1) == -1 and d.get("a") == 1
    assert built == ["c", "d"] and d.unbuilt() == 1
    assert d["c"] == 30 and built == ["c", "d"]  # built once
    with pytest.raises(KeyError):
        d["z"]


WHOLE: dict[str, Callable[[Any], Any]] = {
    "iter": lambda d: sorted(d),
    "keys": lambda d: sorted(d.keys()),
    "values": lambda d: sorted(d.values()),
    "items": lambda d: sorted(d.items()),
    "dict": lambda d: dict(d),
    "unpack": lambda d: {**d},
    "copy": lambda d: d.copy(),
    "copy.copy": lambda d: dict(copy.copy(d)),
    "deepcopy": lambda d: dict(copy.deepcopy(d)),
    "pickle": lambda d: dict(pickle.loads(pickle.dumps(d))),
    "json": lambda d: json.loads(json.dumps(d)),
    "or": lambda d: d | {},
    "ror": lambda d: {} | d,
    "reversed": lambda d: sorted(reversed(d)),
    "eq": lambda d: d == EAGER,
    "eq, reflected": lambda d: EAGER == d,  # noqa: SIM300 - the plain dict on the left
    "ne": lambda d: d != {**EAGER, "e": 0},
    "repr": lambda d: "'e': 50" in repr(d),
}


@pytest.mark.parametrize("name", sorted(WHOLE))
def test_anything_that_goes_over_every_value_sees_them_all_built(name: str) -> None:
    want = WHOLE[name](dict(EAGER))
    assert WHOLE[name](_lazy([])) == want


def test_writes_and_removals_of_a_row_act_as_on_its_built_value() -> None:
    built: list[str] = []
    d = _lazy(built)
    d["c"] = 7  # set over a row: the row is gone, never built
    assert d["c"] == 7 and len(d) == 5 and built == []
    assert d.pop("d") == 40 and "d" not in d and len(d) == 4
    assert d.pop("z", None) is None
    with pytest.raises(KeyError):
        d.pop("z")
    del d["e"]
    assert "e" not in d and len(d) == 3 and built == ["d"]
    with pytest.raises(KeyError):
        del d["e"]
    assert d.setdefault("a", 9) == 1 and d.setdefault("f", 6) == 6
    d.update({"g": 8}, h=9)
    d |= {"i": 1}
    assert d == {"a": 1, "b": 2, "c": 7, "f": 6, "g": 8, "h": 9, "i": 1}
    d.clear()
    assert len(d) == 0 and d == {}


def test_add_source_refuses_a_built_key() -> None:
    d = _lazy([])
    d.add_source("z", 1)
    assert d["z"] == 10
    with pytest.raises(ValueError):
        d.add_source("a", 1)
    with pytest.raises(ValueError):
        LazyDict({"a": 1}, {"a": 2}, lambda key, source: source)


def test_a_tree_node_built_late_has_the_children_added_under_its_row() -> None:
    tree = AgentTree()
    tree.add_unbuilt("p", "sp", "boss", None, "lead", ["prov", "model"])
    tree.add_unbuilt("c", "sc", "child", "p", "work", ["prov", "model"])
    tree.add(AgentNode("d", "sd", "other", "p", "", "prov", "model"))  # an eager child
    tree.check()
    assert tree.unbuilt() == 2 and len(tree) == 3 and tree.agent_of("sc") == "c"
    assert tree.session_of("c") == "sc" and tree.unbuilt() == 2
    assert tree.path("c") == "boss/child"  # builds c and its parent
    parent = tree.get("p")
    assert parent.children == {"child": "c", "other": "d"}
    assert (parent.instructions, parent.provider, parent.model) == ("lead", "prov", "model")
    assert tree.unbuilt() == 0
    tree.check()
    with pytest.raises(NameCollisionError):
        tree.add_unbuilt("e", "se", "child", "p", "", ["prov", "model"])
    assert [n.agent_id for n in tree.walk()] == ["p", "c", "d"]


def test_add_sources_adds_each_and_refuses_a_built_key_adding_none() -> None:
    built: list[str] = []
    d = _lazy(built)
    d.add_sources({"y": 6, "z": 7})
    assert d.unbuilt() == 5 and built == []
    assert d == {**EAGER, "y": 60, "z": 70}
    with pytest.raises(ValueError):
        d.add_sources({"w": 1, "a": 1})
    assert "w" not in d


@pytest.mark.parametrize(
    "name", ["user", "parent", "-lead", ".x", "a b", "", "x" * 65, "é", 7, None, "a/b"]
)
def test_add_unbuilt_refuses_the_names_validate_name_refuses(name: Any) -> None:
    """add_unbuilt checks a name inline (the usual answer first): whatever validate_name
    refuses it refuses, with its message, and adds nothing."""
    from substrat.agents import validate_name

    with pytest.raises(ValueError) as refused:
        validate_name(name)
    tree = AgentTree()
    with pytest.raises(ValueError) as got:
        tree.add_unbuilt("a", "sa", name, None, "", ["prov", "model"])
    assert str(got.value) == str(refused.value)
    assert len(tree) == 0 and tree.agent_of("sa") is None


def test_add_unbuilt_refuses_an_agent_id_built_or_not() -> None:
    tree = AgentTree()
    tree.add_unbuilt("p", "sp", "boss", None, "", ["prov", "model"])
    tree.add(AgentNode("q", "sq", "other", None, "", "prov", "model"))
    for agent_id in ("p", "q"):
        with pytest.raises(ValueError, match="already in the tree"):
            tree.add_unbuilt(agent_id, "sz", "fresh", None, "", ["prov", "model"])
    assert tree.agent_of("sz") is None and len(tree) == 2
