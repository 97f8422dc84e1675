"""The multiplexer: a bounded number of live provider sessions per provider pool.

Live sessions cost memory, processes or connections, so each provider pool
has a fixed number of slots. When a pool is full, the least recently used
session that is not in use is suspended (its blob saved to ``session.json``,
``suspend.result`` logged) to make room; acquiring a suspended session
restores it (``session.restored`` logged). A session in use is never evicted.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from substrat.errors import ProviderError, WrongLoopError
from substrat.providers.base import ProviderSession

if TYPE_CHECKING:
    from substrat.agents import AgentNode

ACQUIRE_TIMEOUT_S = 300.0
MAX_SLOTS = 4096

Loader = Callable[["AgentNode"], Awaitable[ProviderSession]]
Saver = Callable[["AgentNode", ProviderSession], Awaitable[None]]


_background: set[asyncio.Task[None]] = set()


def stop_later(session: ProviderSession) -> None:
    """Stop a session that is no longer needed without waiting for it."""

    async def stop() -> None:
        try:
            await session.stop()
        except Exception:  # stopping a dead session is best effort
            pass

    task = asyncio.get_running_loop().create_task(stop())
    _background.add(task)
    task.add_done_callback(_background.discard)


class Multiplexer:
    """LRU slots per provider pool.

    ``load`` brings a session to life (create or restore, logging it);
    ``save`` suspends one (persisting its blob). Both are the orchestrator's.
    """

    def __init__(self, slots: int, load: Loader, save: Saver) -> None:
        if not 1 <= slots <= MAX_SLOTS:
            raise ValueError(f"slots must be between 1 and {MAX_SLOTS}, got {slots}")
        self.slots = slots
        self._load = load
        self._save = save
        self._pools: dict[str, OrderedDict[str, tuple[AgentNode, ProviderSession]]] = {}
        self._in_use: set[str] = set()
        self._suspending: set[str] = set()
        self._loading: dict[str, int] = {}
        """Sessions being restored, per pool: each holds a slot before it is in the pool."""
        self._changed = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        """The loop ``_changed`` was last waited in: asyncio binds an event to one loop."""
        self.evictions = 0

    def check_loop(self, method: str) -> None:
        """Refuse, before anything is done, a call from another event loop than the one
        the slot waits are bound to, while that one is open (WrongLoopError). One bound to
        a closed loop (the previous ``asyncio.run``'s: its waiters are gone) is let go, so
        ``asyncio.run`` per call works; before, its next wait raised asyncio's "bound to a
        different event loop" (outside review s21f, F10)."""
        bound = self._loop
        if bound is None or bound is asyncio.get_running_loop():
            return
        if bound.is_closed():
            self._loop, self._changed = None, asyncio.Event()
            return
        raise WrongLoopError(
            f"Orchestrator.{method} called in another event loop than the one this "
            "orchestrator's waits for a provider slot are bound to, which is still open: an "
            "orchestrator serves one event loop at a time. Nothing was done; drive it from "
            "one loop (one asyncio.run around the program's async code), or close the other "
            "loop (loop.close()) before using this one"
        )

    async def _wait_changed(self, timeout: float | None = None) -> None:
        """Wait until a slot or session changes (``timeout``: TimeoutError after it)."""
        self.check_loop("wait")
        self._loop = asyncio.get_running_loop()
        self._changed.clear()
        await asyncio.wait_for(self._changed.wait(), timeout)

    def _pool(self, name: str) -> OrderedDict[str, tuple[AgentNode, ProviderSession]]:
        pool = self._pools.get(name)
        if pool is None:
            pool = self._pools[name] = OrderedDict()
        return pool

    def is_live(self, agent_id: str) -> bool:
        return any(agent_id in pool for pool in self._pools.values())

    def live_count(self, provider: str | None = None) -> int:
        if provider is not None:
            return len(self._pools.get(provider, ()))
        return sum(len(pool) for pool in self._pools.values())

    async def acquire(self, node: AgentNode) -> ProviderSession:
        """The node's live session, restored if needed; marked in use until release."""
        while node.agent_id in self._suspending:
            # this very session is being evicted: let that finish, then restore it
            await self._wait_changed()
        assert node.agent_id not in self._in_use, f"{node.agent_id} acquired twice"
        pool = self._pool(node.provider)
        entry = pool.get(node.agent_id)
        if entry is not None:
            pool.move_to_end(node.agent_id)
            self._in_use.add(node.agent_id)
            return entry[1]
        self._in_use.add(node.agent_id)
        try:
            await self._make_room(node.provider)
            # reserve the slot now: other acquires run while this one loads
            self._loading[node.provider] = self._loading.get(node.provider, 0) + 1
            try:
                session = await self._load(node)
            finally:
                self._loading[node.provider] -= 1
                self._changed.set()
        except BaseException:
            self._in_use.discard(node.agent_id)
            raise
        pool[node.agent_id] = (node, session)
        return session

    async def admit(self, node: AgentNode, session: ProviderSession) -> None:
        """Add a freshly created session (not in use) to its pool."""
        self._in_use.add(node.agent_id)
        try:
            await self._make_room(node.provider)
        finally:
            self._in_use.discard(node.agent_id)
        self._pool(node.provider)[node.agent_id] = (node, session)

    def release(self, node: AgentNode) -> None:
        self._in_use.discard(node.agent_id)
        self._changed.set()

    def discard(self, node: AgentNode) -> ProviderSession | None:
        """Forget a live session without suspending it (after a failure or termination)."""
        entry = self._pool(node.provider).pop(node.agent_id, None)
        self._in_use.discard(node.agent_id)
        self._changed.set()
        return None if entry is None else entry[1]

    async def evict(self, node: AgentNode) -> bool:
        """Suspend the node's session now; False if it was not live."""
        pool = self._pool(node.provider)
        if node.agent_id not in pool:
            return False
        if node.agent_id in self._in_use:
            raise ProviderError(f"agent {node.name} is in use and cannot be suspended now")
        await self._suspend(node.provider, node.agent_id)
        return True

    async def suspend_all(self) -> int:
        """Suspend every live session that is not in use (clean shutdown)."""
        count = 0
        for name, pool in self._pools.items():
            for agent_id in [a for a in pool if a not in self._in_use]:
                await self._suspend(name, agent_id)
                count += 1
        return count

    async def _make_room(self, provider: str) -> None:
        pool = self._pool(provider)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ACQUIRE_TIMEOUT_S
        while len(pool) + self._loading.get(provider, 0) >= self.slots:
            victim = next((a for a in pool if a not in self._in_use), None)
            if victim is not None:
                await self._suspend(provider, victim)
                self.evictions += 1
                continue
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise ProviderError(
                    f"all {self.slots} {provider} slots are busy for {ACQUIRE_TIMEOUT_S:.0f} s; "
                    "raise the slot count or wait for turns to finish"
                )
            try:
                await self._wait_changed(remaining)
            except TimeoutError:
                continue

    async def _suspend(self, provider: str, agent_id: str) -> None:
        pool = self._pool(provider)
        node, session = pool[agent_id]
        self._in_use.add(agent_id)
        self._suspending.add(agent_id)
        try:
            await self._save(node, session)
            pool.pop(agent_id, None)
        finally:
            self._in_use.discard(agent_id)
            self._suspending.discard(agent_id)
            self._changed.set()
