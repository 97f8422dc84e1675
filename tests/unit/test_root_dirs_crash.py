"""``roots/`` and ``checkpoints/`` are made durable below the root only, at every crash point.

``Orchestrator.open`` makes the root's entry and every level above it durable
(``SessionStore.make_root_durable``). The root registry and the checkpoint store
create their directories through the same store (``SessionStore.make_dir``), so
their first write fsyncs the root for their own entry and not every level up to
the file system's root again. A crash anywhere in a first open of a new root, its
first root agent and a clean close must still leave: the agent registered once
``create_root`` returned, and its checkpoint readable once ``close`` returned.
"""

from __future__ import annotations

import asyncio
import os

import pytest

from faultfs import PROFILES, FaultFS, explore
from substrat import persistence
from substrat.checkpoints import read_store
from substrat.orchestrator import Orchestrator
from substrat.providers.registry import ProviderRegistry
from substrat.providers.scripted import ScriptedProvider
from substrat.registry import RootRegistry

CREATED = "created"
CLOSED = "closed"


def _providers() -> ProviderRegistry:
    registry = ProviderRegistry()
    registry.register("scripted", ScriptedProvider)
    return registry


def _root(fs: FaultFS) -> str:
    # two levels that do not exist yet: open creates both, and makes both durable
    return fs.path("home", "root")


async def _first_root(fs: FaultFS) -> None:
    orch = await Orchestrator.open(_root(fs), registry=_providers())
    await orch.create_root("ada")
    fs.ack(CREATED)
    await orch.close()  # suspends ada: her checkpoint goes to checkpoints/
    fs.ack(CLOSED)


def _workload(fs: FaultFS) -> None:
    asyncio.run(_first_root(fs))


def _check(img: FaultFS) -> None:
    root = _root(img)
    if CREATED not in img.acked:
        return  # nothing was promised (what recovery does with less is its own tests')
    where = img.origin
    read = RootRegistry(root).load()
    names = [data["name"] for data in read.roots.values()]
    assert read.problem is None and names == ["ada"], f"registry {read} after a crash at {where}"
    if CLOSED in img.acked:
        store = read_store(root)
        assert store.problem is None and len(store.checkpoints) == 1, (
            f"checkpoints {store} after a crash at {where}"
        )


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_a_new_root_cut_anywhere_keeps_its_registered_agent_and_checkpoint(profile: str) -> None:
    report = explore(_workload, _check, profile=profile, root="/dirs-root", images_per_mode=4)
    report.assert_ok()
    assert report.boundaries >= 30, report.boundaries


def test_the_registry_and_the_checkpoints_fsync_no_level_above_the_root() -> None:
    """After open, a first root agent and a clean close fsync the root for ``roots/``
    and ``checkpoints/``, and no directory above it (open made those durable)."""
    fs = FaultFS("/dirs-count")
    synced: list[str] = []
    original = persistence.fsync_dir

    def counted(path: str | os.PathLike[str]) -> None:
        synced.append(os.fspath(path))
        original(path)

    with fs:
        loop = asyncio.new_event_loop()
        try:
            orch = loop.run_until_complete(Orchestrator.open(_root(fs), registry=_providers()))
            persistence.fsync_dir = counted
            try:
                loop.run_until_complete(orch.create_root("ada"))
                loop.run_until_complete(orch.close())
            finally:
                persistence.fsync_dir = original
        finally:
            loop.close()
    root = _root(fs)
    above = [path for path in synced if not path.startswith(root)]
    assert above == [], f"directories above the root fsynced again: {above}"
    assert synced.count(root) >= 2, synced  # roots/ and checkpoints/ entries
