"""An orchestrator driven by ``asyncio.run`` per call, and one called from a second open loop.

Outside review s21f (F10): ``asyncio.run`` per call (open in one, turns in the
next ones) worked until two turns contended for a provider slot; from the next
``asyncio.run`` on, every such wait raised asyncio's ``<Event ...> is bound to a
different event loop``, which says nothing of what to do. A loop that
``asyncio.run`` closed has no waiters left, so the multiplexer lets it go; a loop
still open may, so a call from another one is refused first, in words, with
nothing done (substrat.multiplexer.Multiplexer.check_loop).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from substrat.demo import PacedProvider
from substrat.errors import WrongLoopError
from substrat.orchestrator import Orchestrator
from substrat.providers.registry import ProviderRegistry, default_registry
from tests.support import roots


def _registry() -> ProviderRegistry:
    registry = default_registry()
    registry.register("paced", PacedProvider)  # a turn that awaits: the other one waits
    return registry


async def _contend(orch: Orchestrator, tag: str) -> None:
    """Two agents' turns at once on one slot: the second waits for the first's slot."""
    await asyncio.gather(orch.run_turn("a", f"{tag}\nmore"), orch.run_turn("b", f"{tag}\nmore"))


def _opened(root: Path) -> Orchestrator:
    orch = asyncio.run(Orchestrator.open(root, slots=1, registry=_registry()))

    async def create() -> None:
        for name in ("a", "b"):
            await orch.create_root(name, "You help.", provider="paced", model="5ms")

    asyncio.run(create())
    return orch


def test_asyncio_run_per_call_waits_for_slots_in_every_loop(root: Path) -> None:
    orch = _opened(root)
    for round_ in range(3):
        asyncio.run(_contend(orch, f"round {round_}"))
    assert [t.prompt for t in orch.history("a")] == [f"round {i}\nmore" for i in range(3)]
    asyncio.run(orch.close())
    assert roots.cli(root, "fsck").returncode == 0


def test_a_second_open_loop_is_refused_with_nothing_done(root: Path) -> None:
    orch = _opened(root)
    first = asyncio.new_event_loop()
    try:
        first.run_until_complete(_contend(orch, "in the first loop"))  # binds the waits
        with pytest.raises(WrongLoopError, match="one event loop at a time") as refused:
            asyncio.run(orch.run_turn("a", "in a second loop"))
        assert "loop.close()" in str(refused.value)
        assert [t.prompt for t in orch.history("a")] == ["in the first loop\nmore"]
        first.run_until_complete(_contend(orch, "again in the first"))  # still served
    finally:
        first.close()
    asyncio.run(_contend(orch, "after it closed"))  # a closed loop is let go
    assert [t.prompt for t in orch.history("b")] == [
        "in the first loop\nmore",
        "again in the first\nmore",
        "after it closed\nmore",
    ]
    asyncio.run(orch.close())
    assert roots.cli(root, "fsck").returncode == 0
