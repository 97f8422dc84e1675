"""The multiplexer: LRU slots per provider pool; sessions in use are never evicted."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from substrat import multiplexer
from substrat.agents import AgentNode
from substrat.errors import ProviderError
from substrat.multiplexer import MAX_SLOTS, Multiplexer, stop_later

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


class Live:
    """A stand-in live session: the multiplexer only stores and hands it back."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.stopped = False

    async def stop(self) -> None:
        self.stopped = True


class Backend:
    """Records loads and saves; either can be told to fail."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.fail_load = False
        self.fail_save = False

    async def load(self, node: AgentNode) -> Any:
        self.events.append(f"load {node.name}")
        await asyncio.sleep(0)
        if self.fail_load:
            raise ProviderError("load failed")
        return Live(node.name)

    async def save(self, node: AgentNode, live: Any) -> None:
        self.events.append(f"save {node.name}")
        await asyncio.sleep(0)
        if self.fail_save:
            raise ProviderError("save failed")


def agent(name: str, provider: str = "p") -> AgentNode:
    return AgentNode(name, f"s-{name}", name, None, "", provider, "m")


def mux(slots: int) -> tuple[Multiplexer, Backend]:
    backend = Backend()
    return Multiplexer(slots, backend.load, backend.save), backend


@pytest.mark.parametrize("slots", [0, -1, MAX_SLOTS + 1])
def test_slot_count_is_checked(slots: int) -> None:
    with pytest.raises(ValueError, match="slots must be between"):
        Multiplexer(slots, Backend().load, Backend().save)


def test_least_recently_used_is_evicted() -> None:
    async def go() -> None:
        m, backend = mux(2)
        a, b, c = agent("a"), agent("b"), agent("c")
        first = await m.acquire(a)
        m.release(a)
        await m.acquire(b)
        m.release(b)
        assert await m.acquire(a) is first  # live: no load, and a is now most recent
        m.release(a)
        await m.acquire(c)
        m.release(c)
        assert backend.events == ["load a", "load b", "save b", "load c"]
        assert m.is_live("a") and not m.is_live("b") and m.is_live("c")
        assert m.evictions == 1 and m.live_count() == m.live_count("p") == 2

    run(go())


def test_a_session_in_use_is_never_evicted() -> None:
    async def go() -> None:
        m, backend = mux(2)
        a, b, c = agent("a"), agent("b"), agent("c")
        await m.acquire(a)  # held
        await m.acquire(b)
        m.release(b)
        await m.acquire(c)
        assert backend.events == ["load a", "load b", "save b", "load c"]
        with pytest.raises(ProviderError, match="in use"):
            await m.evict(a)
        m.release(a)
        assert await m.evict(a) is True and await m.evict(a) is False
        with pytest.raises(AssertionError, match="acquired twice"):
            await m.acquire(c)

    run(go())


def test_acquire_waits_for_a_release_then_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(multiplexer, "ACQUIRE_TIMEOUT_S", 0.2)

    async def go() -> None:
        m, backend = mux(1)
        a, b = agent("a"), agent("b")
        await m.acquire(a)
        waiter = asyncio.create_task(m.acquire(b))
        await asyncio.sleep(0.01)
        assert not waiter.done()
        m.release(a)
        assert (await waiter).name == "b"
        assert backend.events == ["load a", "save a", "load b"]
        with pytest.raises(ProviderError, match="slots are busy"):
            await m.acquire(a)  # b is held and never released
        assert not m.is_live("a")
        m.release(b)
        assert (await m.acquire(a)).name == "a"  # the failed wait left nothing behind

    run(go())


def test_pools_are_per_provider() -> None:
    async def go() -> None:
        m, _backend = mux(1)
        x, y = agent("x", "one"), agent("y", "two")
        await m.acquire(x)
        await m.acquire(y)  # another pool: no wait, no eviction
        assert m.live_count("one") == m.live_count("two") == 1 and m.evictions == 0

    run(go())


def test_admit_discard_and_suspend_all() -> None:
    async def go() -> None:
        m, backend = mux(2)
        a, b, c = agent("a"), agent("b"), agent("c")
        created = Live("a")
        await m.admit(a, created)
        assert await m.acquire(a) is created and backend.events == []
        m.release(a)
        await m.admit(b, Live("b"))
        await m.admit(c, Live("c"))  # evicts a, the least recent
        assert backend.events == ["save a"]
        assert m.discard(b) is not None and m.discard(b) is None
        await m.acquire(c)  # in use: skipped by suspend_all
        m.release(c)
        await m.acquire(a)
        assert await m.suspend_all() == 1
        assert backend.events[-1] == "save c" and m.is_live("a") and not m.is_live("c")

    run(go())


def test_failed_load_or_save_leaves_the_slots_consistent() -> None:
    async def go() -> None:
        m, backend = mux(1)
        a, b = agent("a"), agent("b")
        backend.fail_load = True
        with pytest.raises(ProviderError, match="load failed"):
            await m.acquire(a)
        backend.fail_load = False
        await m.acquire(a)
        m.release(a)
        backend.fail_save = True
        with pytest.raises(ProviderError, match="save failed"):
            await m.acquire(b)  # making room fails: a stays live, b is not loaded
        assert m.is_live("a") and not m.is_live("b")
        backend.fail_save = False
        await m.acquire(b)
        assert m.is_live("b") and not m.is_live("a")

    run(go())


def test_stop_later_stops_without_waiting_and_swallows_errors() -> None:
    class Broken(Live):
        async def stop(self) -> None:
            raise RuntimeError("already dead")

    async def go() -> None:
        live = Live("a")
        stop_later(live)  # type: ignore[arg-type]
        stop_later(Broken("b"))  # type: ignore[arg-type]
        assert not live.stopped
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert live.stopped

    run(go())


def test_acquire_during_its_own_eviction_waits_then_restores() -> None:
    async def go() -> None:
        gate = asyncio.Event()
        m, backend = mux(1)
        real_save = backend.save

        async def slow_save(node: AgentNode, live: Any) -> None:
            await gate.wait()
            await real_save(node, live)

        m._save = slow_save
        a, b = agent("a"), agent("b")
        await m.acquire(a)
        m.release(a)
        taking_b = asyncio.create_task(m.acquire(b))  # evicts a, slowly
        await asyncio.sleep(0.01)
        taking_a = asyncio.create_task(m.acquire(a))  # a is mid-eviction
        await asyncio.sleep(0.01)
        assert not taking_a.done()
        gate.set()
        await taking_b
        m.release(b)
        assert (await taking_a).name == "a"
        assert backend.events == ["load a", "save a", "load b", "save b", "load a"]

    run(go())


def test_a_failed_eviction_wakes_whoever_waits_for_it() -> None:
    async def go() -> None:
        m, backend = mux(1)
        a, b = agent("a"), agent("b")
        await m.acquire(a)
        m.release(a)
        backend.fail_save = True
        taking_b = asyncio.create_task(m.acquire(b))
        taking_a = asyncio.create_task(m.acquire(a))
        with pytest.raises(ProviderError, match="save failed"):
            await taking_b
        assert (await asyncio.wait_for(taking_a, 1.0)).name == "a"  # still live: no reload
        assert backend.events == ["load a", "save a"]

    run(go())


def test_concurrent_loads_never_exceed_the_slots() -> None:
    async def go() -> None:
        m, backend = mux(2)
        peak = 0
        real_load = backend.load

        async def slow_load(node: AgentNode) -> Any:
            nonlocal peak
            await asyncio.sleep(0.01)  # a restore takes time: other acquires run meanwhile
            live = await real_load(node)
            peak = max(peak, m.live_count() + 1)
            return live

        m._load = slow_load

        async def turn(name: str) -> None:
            node = agent(name)
            await m.acquire(node)
            await asyncio.sleep(0.01)
            m.release(node)

        await asyncio.gather(*(turn(n) for n in "abcdef"))
        assert peak <= 2 and m.live_count() <= 2
        assert backend.events.count("save a") + m.is_live("a") == 1

    run(go())
