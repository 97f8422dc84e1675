"""One garbage collection at a process's end on CPython, and what it still reports
(tests/conftest.py, ``fewer_final_collections``)."""

from __future__ import annotations

import gc
import sys
from types import SimpleNamespace
from typing import Any

import pytest
from _pytest import unraisableexception

from tests import conftest

KEY = unraisableexception.gc_collect_iterations_key


@pytest.mark.skipif(sys.implementation.name != "cpython", reason="PyPy keeps pytest's count")
def test_this_session_collects_once_at_its_end(pytestconfig: pytest.Config) -> None:
    assert pytestconfig.stash[KEY] == conftest.FINAL_COLLECTIONS == 1


def test_a_count_chosen_already_is_kept() -> None:
    config: Any = SimpleNamespace(stash=pytest.Stash())
    config.stash[KEY] = 0  # as pytester's inline runs choose
    conftest.fewer_final_collections(config)
    assert config.stash[KEY] == 0


class Cycle:
    """An object in a reference cycle whose finalizer raises: what only a collection frees."""

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        raise RuntimeError("raised while finalized")


def test_one_collection_reports_what_a_cycle_raises_when_finalized(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The reason one is enough on CPython: a single collection finalizes every cycle left,
    so the unraisable exception still reaches the hook pytest reports from."""
    seen: list[BaseException | None] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda args: seen.append(args.exc_value))
    was_enabled = gc.isenabled()
    gc.disable()  # no automatic collection before the one counted
    try:
        Cycle()
        assert not seen
        gc.collect()
    finally:
        if was_enabled:
            gc.enable()
    assert [str(e) for e in seen] == ["raised while finalized"]
