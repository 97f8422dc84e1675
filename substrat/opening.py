"""How an orchestrator's hold on its root ends: ``close``, the ``async with`` block, or a drop.

``Orchestrator.open(root)`` returns an :class:`Opening`: a coroutine (``await``
it, hand it to ``asyncio.run`` or a task, as before) that is also an async
context manager, so ``async with Orchestrator.open(root) as orch:`` closes the
orchestrator when the block ends, however it ends. An orchestrator is itself
one too (``async with orch:``), for one opened by ``await``.

An orchestrator dropped without ``close`` (its last reference gone, say after
an exception skipped the close) cannot write any more: nothing can reach it.
Its hold on the root (:mod:`substrat.root_hold`) used to outlive it until the
process ended, so the program could not open its own root again (outside review
s21f, F12). Now the collector's finalizer lets go of the hold, with a
ResourceWarning, as the kernel does for a process that dies: what the dropped
one left is what a crash leaves, and the next open recovers it (nothing
acknowledged is lost; its sessions were not suspended, so they are rebuilt from
the logs). An orchestrator is in reference cycles, so only the cyclic collector
frees it: a refused open whose holder is this very process runs that collector
once and tries again, and if a live orchestrator of this process still holds
the root, the error says to close it.
"""

from __future__ import annotations

import gc
import os
import warnings
import weakref
from collections.abc import Coroutine, Generator
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from substrat.errors import RootLockedError
from substrat.root_hold import RootHold
from substrat.rpc.lock import flock_holder


class Closable(Protocol):
    async def close(self) -> None: ...


T = TypeVar("T", bound=Closable)


class Opening(Coroutine[Any, Any, T], Generic[T]):
    """An orchestrator being opened: await it, or ``async with`` it (module docstring)."""

    __slots__ = ("_coro", "_opened")

    def __init__(self, coro: Coroutine[Any, Any, T]) -> None:
        self._coro = coro
        self._opened: T | None = None

    def send(self, value: Any) -> Any:
        return self._coro.send(value)

    def throw(self, *args: Any) -> Any:
        return self._coro.throw(*args)

    def close(self) -> None:
        self._coro.close()

    def __await__(self) -> Generator[Any, None, T]:
        return self._coro.__await__()

    async def __aenter__(self) -> T:
        self._opened = await self._coro
        return self._opened

    async def __aexit__(self, *exc: object) -> None:
        if self._opened is not None:
            await self._opened.close()


def take_hold(root: Path) -> RootHold:
    """The root's hold for a new orchestrator (RootLockedError if it is not to be had);
    a dropped orchestrator of this process that still holds it is collected first."""
    try:
        return RootHold.take(root)
    except RootLockedError:
        if flock_holder(root) != os.getpid():
            raise
    gc.collect()  # runs the finalizer of a dropped one (release_when_dropped)
    return RootHold.take(root)  # still held: a live orchestrator here; the error says so


def release_when_dropped(orch: object, hold: RootHold) -> None:
    """Let go of ``hold`` when ``orch`` is collected without having been closed."""
    weakref.finalize(orch, _dropped, hold)


def _dropped(hold: RootHold) -> None:
    if not hold.held:
        return  # closed (or abandoned as a kill would): nothing to say
    warnings.warn(
        f"an Orchestrator on {hold.root} was dropped without close(); its hold on the root "
        "is released as a crash would release it, and the next open recovers the root. "
        "Close it (await orch.close()), or open it with "
        "`async with Orchestrator.open(root) as orch:`",
        ResourceWarning,
        stacklevel=2,
    )
    hold.release()
