"""An orchestrator's hold on its root ends with ``close``, its ``async with`` block, or a drop.

Outside review s21f (F12): the library had no ``async with``, and an orchestrator
dropped without ``close`` kept its root held for the rest of the process, so the
program could not open its own root again (RootLockedError said "close it there
first", which it no longer could). See substrat.opening.
"""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

import pytest

from substrat.errors import RootLockedError
from substrat.orchestrator import Orchestrator
from tests.support import roots


async def _prompts(root: Path) -> list[str]:
    async with Orchestrator.open(root) as orch:
        return [t.prompt for t in orch.history("app")]


def test_async_with_open_closes_the_orchestrator_when_the_block_ends(root: Path) -> None:
    async def scenario() -> None:
        async with Orchestrator.open(root) as orch:
            await orch.create_root("app", "You help.")
            await orch.run_turn("app", "one")
        assert orch.closed
        with pytest.raises(ValueError, match="inside"):
            async with Orchestrator.open(root) as again:
                await again.run_turn("app", "two")
                raise ValueError("inside the block")
        assert again.closed  # an exception leaving the block closes it too
        async with await Orchestrator.open(root) as opened:  # an opened one, the same
            assert [t.prompt for t in opened.history("app")] == ["one", "two"]
        assert opened.closed

    asyncio.run(scenario())
    assert roots.cli(root, "fsck").returncode == 0  # each closed cleanly, nothing to repair


def test_a_dropped_orchestrator_lets_go_of_its_root(root: Path) -> None:
    """Dropped without close (the collector has not run yet): the next open in the same
    process gets the root, with a ResourceWarning, and recovers what the dropped one
    acknowledged, as after a crash."""

    async def scenario() -> None:
        orch = await Orchestrator.open(root)
        await orch.create_root("app", "You help.")
        await orch.run_turn("app", "kept")
        gc.disable()  # only open's own collection may free it
        try:
            with pytest.warns(ResourceWarning, match="dropped without close"):
                del orch  # (freed here if nothing refers back to it, else by open)
                again = await Orchestrator.open(root)
        finally:
            gc.enable()
        try:
            assert [t.prompt for t in again.history("app")] == ["kept"]
            await again.run_turn("app", "after")
        finally:
            await again.close()

    asyncio.run(scenario())
    assert asyncio.run(_prompts(root)) == ["kept", "after"]
    assert roots.cli(root, "fsck").returncode == 0


def test_a_live_orchestrator_of_this_process_is_named_with_the_fix(root: Path) -> None:
    async def scenario() -> None:
        async with Orchestrator.open(root):
            with pytest.raises(RootLockedError) as refused:
                await Orchestrator.open(root)
        said = str(refused.value)
        assert "another Orchestrator of this process" in said
        assert "await orch.close()" in said and "async with Orchestrator.open(root)" in said

    asyncio.run(scenario())


def test_open_is_still_a_coroutine_for_asyncio_run_and_tasks(root: Path) -> None:
    orch = asyncio.run(Orchestrator.open(root))
    asyncio.run(orch.close())

    async def in_a_task() -> None:
        opened = await asyncio.wait_for(asyncio.ensure_future(Orchestrator.open(root)), 60)
        await opened.close()

    asyncio.run(in_a_task())
