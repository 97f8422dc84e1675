"""Draws for the state machines that do not build a new strategy every time.

``data.draw(st.sampled_from(items))`` builds, validates and labels a fresh
strategy on every call, which cost a state machine about a tenth of its CPU
time; the lists drawn from repeat (the same agents, step after step), so the
strategies are kept by value (:func:`pick`). Cheaper still is no draw inside
the rule at all: a rule takes a :data:`choice` argument, drawn with its other
arguments, and :func:`nth` turns it into one of the current candidates.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any, TypeVar

from hypothesis import strategies as st

T = TypeVar("T")
CACHED_STRATEGIES = 4096
MAX_CHOICES = 64
choice = st.integers(0, MAX_CHOICES - 1)
"""Which of the current agents (or targets) a rule acts on, taken modulo the number
there are (:func:`nth`); shrinks towards the first."""


def nth(items: Sequence[T], index: int) -> T:
    """``items[index]``, wrapping round: how a drawn :data:`choice` picks one."""
    assert items, "nothing to choose from (the rule's precondition should have said so)"
    return items[index % len(items)]


@lru_cache(maxsize=CACHED_STRATEGIES)
def _sampled(items: tuple[Any, ...]) -> st.SearchStrategy[Any]:
    return st.sampled_from(items)


def pick(data: st.DataObject, items: Sequence[T], label: str) -> T:
    """One of ``items`` (shrinks towards the first), as ``st.sampled_from`` draws it."""
    value: T = data.draw(_sampled(tuple(items)), label=label)
    return value
