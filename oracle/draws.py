"""Draws for the state machines that do not build a new strategy every time.

``data.draw(st.sampled_from(items))`` builds, validates and labels a fresh
strategy on every call, which cost a state machine about a tenth of its CPU
time; the lists drawn from repeat (the same agents, step after step), so the
strategies are kept by value (:func:`pick`). Cheaper still is no draw inside
the rule at all: a rule takes a :data:`choice` argument, drawn with its other
arguments, and :func:`nth` turns it into one of the current candidates. That
changes how the examples are built, though (what the engine's mutations copy
from one step to another), and with it how often each rule runs; :func:`draw`
keeps the draws inside the rule and makes them cheaper instead, and
:func:`integer`, :func:`flag` and :func:`pick` cheaper still: the same choices
with no span around them (tests/unit/test_fuzzer_draws.py holds them to it).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from functools import lru_cache
from typing import Any, TypeVar

from hypothesis import strategies as st
from hypothesis.control import should_note

T = TypeVar("T")
ENGINE_CHOICE_METHODS = ("draw_integer", "draw_boolean")


def _engine_makes_choices() -> bool:
    """Whether this Hypothesis's engine data has the integer and boolean choices
    :func:`integer`, :func:`flag` and :func:`pick` make directly.

    They are the engine's own methods, not its public API: a release that renames
    them leaves these functions drawing through ``data.draw`` (the same values,
    only slower), instead of failing every state machine that uses them.
    """
    try:
        from hypothesis.internal.conjecture.data import ConjectureData
    except ImportError:
        return False
    return all(callable(getattr(ConjectureData, n, None)) for n in ENGINE_CHOICE_METHODS)


CACHED_STRATEGIES = 4096
MAX_CHOICES = 64
choice = st.integers(0, MAX_CHOICES - 1)
"""Which of the current agents (or targets) a rule acts on, taken modulo the number
there are (:func:`nth`); shrinks towards the first."""


ENGINE_CHOICES = _engine_makes_choices()
"""Whether the engine's choices are drawn directly (see :func:`_engine_makes_choices`)."""


_asked: tuple[weakref.ref[Any], bool] | None = None
"""The engine data :func:`noting` was last asked about, and its answer."""


def noting(engine: Any) -> bool:
    """``should_note()`` for the test case whose engine data is ``engine``, asked once a
    test case: whether notes print (the replay that prints a counterexample, or a
    verbose run) holds for the whole of it. On the Hypothesis of the image CI runs
    (6.155) an ask compares two verbosities, each comparison building a dict, about
    14 us: asked at every draw, that was a fiftieth of the crash fuzzer's CPU.
    """
    global _asked
    if _asked is not None and _asked[0]() is engine:
        return _asked[1]
    answer = should_note()
    try:
        _asked = (weakref.ref(engine), answer)
    except TypeError:  # an engine data no weak reference can name: asked every time
        _asked = None
    return answer


def nth(items: Sequence[T], index: int) -> T:
    """``items[index]``, wrapping round: how a drawn :data:`choice` picks one."""
    assert items, "nothing to choose from (the rule's precondition should have said so)"
    return items[index % len(items)]


@lru_cache(maxsize=CACHED_STRATEGIES)
def _sampled(items: tuple[Any, ...]) -> st.SearchStrategy[Any]:
    return st.sampled_from(items)


def draw(data: st.DataObject, strategy: st.SearchStrategy[T], label: str) -> T:
    """``data.draw(strategy, label=label)``: the same choices, without what only its
    notes need while no note is printed.

    ``DataObject.draw`` wraps each draw in a check that the strategy left the global
    random state alone (two copies of it) and formats a note; that was about a
    twentieth of the crash fuzzer's CPU. Drawing from the engine's data directly
    makes the same choices in the same spans, so the examples are the ones
    ``data.draw`` makes. When notes are printed (the falsifying example's final
    run, verbose output) every draw goes through ``data.draw``, so a failure shows
    each draw with its label as before.
    """
    engine = getattr(data, "conjecture_data", None)
    if engine is None or noting(engine):
        return data.draw(strategy, label=label)
    value: T = engine.draw(strategy)
    return value


@lru_cache(maxsize=CACHED_STRATEGIES)
def _integers(low: int, high: int) -> st.SearchStrategy[int]:
    return st.integers(low, high)


def integer(data: st.DataObject, low: int, high: int, label: str) -> int:
    """``draw(data, st.integers(low, high), label)`` for a range of at most 128
    values (``st.integers`` weighs the ends of wider ones): the same choice, the
    engine's integer choice itself, without the span a strategy's draw opens
    (its bookkeeping is most of a small draw's cost). Through ``data.draw`` when
    notes are printed, as :func:`draw` does: the same choice, so a failing example
    replays, now shown with its label."""
    assert high - low <= 127, (low, high)
    engine = getattr(data, "conjecture_data", None)
    if engine is None or not ENGINE_CHOICES or noting(engine):
        return data.draw(_integers(low, high), label=label)
    value: int = engine.draw_integer(low, high)
    return value


def flag(data: st.DataObject, label: str, quiet: bool = False) -> bool:
    """``draw(data, st.booleans(), label)`` without the span (see :func:`integer`).

    ``quiet``: not shown even when notes are printed (see :func:`pick`)."""
    engine = getattr(data, "conjecture_data", None)
    if engine is None or not ENGINE_CHOICES or (not quiet and noting(engine)):
        return data.draw(st.booleans(), label=label)
    value: bool = engine.draw_boolean()
    return value


def pick(data: st.DataObject, items: Sequence[T], label: str, quiet: bool = False) -> T:
    """One of ``items`` (shrinks towards the first), as ``st.sampled_from`` draws it:
    the same integer choice of an index (see :func:`integer`).

    ``quiet``: the same choice, not shown as a draw even when notes are printed,
    for a caller that prints what it drew in its own words (the lifecycle
    machine prints each step as a call; the draws' raw values only repeat it)."""
    engine = getattr(data, "conjecture_data", None)
    if (
        engine is None
        or not ENGINE_CHOICES
        or (not quiet and noting(engine))
        or not 1 <= len(items) <= 128
    ):
        # (no items: st.sampled_from raises, as it did)
        return data.draw(_sampled(tuple(items)), label=label)
    if len(items) == 1:
        return items[0]  # st.sampled_from of one item is st.just(it): no choice is made
    return items[engine.draw_integer(0, len(items) - 1)]
