"""Session records are never written ACTIVE, at every crash point (``SessionStore.activate``).

A root's creation writes its record once (CREATED, before its commit point), a
restore writes none, so a restart finds no ACTIVE record to rewrite SUSPENDED.
The crash semantics must be those of the writes they replace: a crash anywhere in
a root's creation, two turns around an eviction (the second restored from the
blob), a spawn and the child's first turn, then a restart, must leave every
acknowledged agent and turn, no record ACTIVE, and sessions that answer from the
whole conversation (the scripted provider's digest chains every prompt: a
session restored from the blob the record kept, stale by then, would answer
differently). docs/orchestrator.md, "Session records", has the crash points.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from faultfs import PROFILES, FaultFS, explore
from substrat.orchestrator import Orchestrator
from substrat.providers.registry import ProviderRegistry
from substrat.providers.scripted import ScriptedProvider, chain_digest, reply_digest
from substrat.session import Session, SessionState, SessionStore

CREATED, FIRST, EVICTED, SECOND, SPAWNED, CHILD = range(1, 7)
PROMPTS = {FIRST: "one", SECOND: "two", SPAWNED: "@spawn kid help"}
KID_PROMPT = "hi kid"


def _providers() -> ProviderRegistry:
    registry = ProviderRegistry()
    registry.register("scripted", ScriptedProvider)
    return registry


async def _lifecycle(root: str, ack: Callable[[int], None]) -> Orchestrator:
    orch = await Orchestrator.open(root, registry=_providers())
    await orch.create_root("ada")
    ack(CREATED)
    for step in (FIRST, EVICTED, SECOND, SPAWNED):
        if step == EVICTED:
            assert await orch.evict("ada")  # its record SUSPENDED, with the blob of "one"
        else:
            await orch.run_turn("ada", PROMPTS[step])  # "two": restored from that blob
        ack(step)
    await orch.run_turn("ada/kid", KID_PROMPT)  # the child's first session: a new one
    ack(CHILD)
    return orch  # not closed: the check's open is a restart after a kill


def _workload(fs: FaultFS) -> None:
    asyncio.run(_lifecycle(fs.path("root"), fs.ack))


def _states(root: str) -> dict[str, SessionState]:
    scan = SessionStore(root).scan(quarantine=False)
    return {s.session_id: s.state for s in scan.sessions}


async def _probe(orch: Orchestrator, agent: str, acked: list[str]) -> None:
    """The agent is there with every acknowledged turn, and its session answers from
    the whole conversation its log holds."""
    prompts = [turn.prompt for turn in orch.history(agent)]
    assert prompts[: len(acked)] == acked and len(prompts) <= len(acked) + 1, (agent, prompts)
    result = await orch.run_turn(agent, "probe")
    digest = ""
    for prompt in [*prompts, result.prompt]:
        digest = chain_digest(digest, prompt)
    assert reply_digest(result.response) == digest, (agent, prompts, result.response)


async def _restart(img: FaultFS) -> None:
    orch = await Orchestrator.open(img.path("root"), registry=_providers())
    try:
        names = {a.name for a in orch.agents()}
        if CREATED in img.acked:
            assert "ada" in names, names
            acked = [PROMPTS[s] for s in (FIRST, SECOND, SPAWNED) if s in img.acked]
            await _probe(orch, "ada", acked)
        if SPAWNED in img.acked:
            await _probe(orch, "ada/kid", [KID_PROMPT] if CHILD in img.acked else [])
    finally:
        await orch.close()


def _check(img: FaultFS) -> None:
    root = img.path("root")
    if os.path.isdir(root):
        states = _states(root)
        # the restart below has no record to rewrite (before: one per session left live)
        assert SessionState.ACTIVE not in states.values(), f"{states} at {img.origin}"
    asyncio.run(_restart(img))


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_a_lifecycle_cut_anywhere_leaves_no_active_record_and_loses_nothing(
    profile: str,
) -> None:
    report = explore(_workload, _check, profile=profile, root="/records-root", images_per_mode=2)
    report.assert_ok()
    assert report.boundaries >= 100, report.boundaries


@contextmanager
def _record_writes() -> Iterator[list[tuple[str, SessionState]]]:
    """Every record write (``SessionStore.save``) made meanwhile: (session id, state)."""
    written: list[tuple[str, SessionState]] = []
    original = SessionStore.save

    def save(self: SessionStore, session: Session) -> bool:
        written.append((session.session_id, session.state))
        return original(self, session)

    SessionStore.save = save  # type: ignore[method-assign]
    try:
        yield written
    finally:
        SessionStore.save = original  # type: ignore[method-assign]


def test_a_creation_writes_one_record_a_restore_none_and_a_restart_none(tmp_path: Path) -> None:
    """create_root: CREATED alone; an evicted agent's next turn: no write; a restart of a
    root a kill left with live sessions: no write (each was one more before)."""

    async def go() -> None:
        orch = await Orchestrator.open(tmp_path / "root", registry=_providers())
        with _record_writes() as written:
            info = await orch.create_root("ada")
        assert written == [(info.session_id, SessionState.CREATED)]
        await orch.run_turn("ada", "one")
        await orch.evict("ada")
        with _record_writes() as written:
            await orch.run_turn("ada", "two")  # restored from the blob
        assert written == []
        assert orch.sessions[info.session_id].state is SessionState.ACTIVE
        assert _states(str(tmp_path / "root")) == {info.session_id: SessionState.SUSPENDED}
        # what a kill leaves (every completed call), opened by a new process
        shutil.copytree(tmp_path / "root", tmp_path / "killed")
        await orch.close()
        with _record_writes() as written:
            again = await Orchestrator.open(tmp_path / "killed", registry=_providers())
        assert written == []
        result = await again.run_turn("ada", "three")  # rebuilt from the log: the blob is stale
        digest = ""
        for prompt in ("one", "two", "three"):
            digest = chain_digest(digest, prompt)
        assert reply_digest(result.response) == digest
        await again.close()

    asyncio.run(go())


def test_a_record_an_older_substrat_left_active_is_still_made_suspended(tmp_path: Path) -> None:
    """Older versions wrote ACTIVE: a restart still rewrites such a record SUSPENDED."""

    async def go() -> None:
        orch = await Orchestrator.open(tmp_path / "root", registry=_providers())
        info = await orch.create_root("ada")
        await orch.run_turn("ada", "one")
        shutil.copytree(tmp_path / "root", tmp_path / "killed")  # no clean stop: no summary
        await orch.close()
        store = SessionStore(tmp_path / "killed")
        old = store.load(info.session_id)
        old.state = SessionState.ACTIVE
        store.save(old)  # as an older substrat left a live session
        again = await Orchestrator.open(tmp_path / "killed", registry=_providers())
        assert _states(str(tmp_path / "killed")) == {info.session_id: SessionState.SUSPENDED}
        assert (await again.run_turn("ada", "two")).turn_id == "t2"
        await again.close()

    asyncio.run(go())
