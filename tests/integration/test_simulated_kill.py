"""A simulated kill releases every descriptor the orchestrator held.

The fuzzers simulate thousands of kills in one process; a descriptor left open
by each (the root registry's log was) piles up until the run dies of EMFILE on
a machine with the usual limit of 1024 open files.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from substrat.orchestrator import Orchestrator
from tests.stress.test_lifecycle_fuzz import LifecycleMachine
from tests.support.kill import abandon

FD_DIR = Path("/proc/self/fd")
pytestmark = pytest.mark.skipif(not FD_DIR.is_dir(), reason="needs /proc/self/fd (Linux)")


def open_fds_under(path: Path) -> list[str]:
    """What this process holds open below ``path`` (deleted files included)."""
    prefix = f"{path}/"
    held = []
    for entry in FD_DIR.iterdir():
        try:
            target = os.readlink(entry)
        except OSError:  # closed since the listing (the listing's own descriptor)
            continue
        if target.startswith(prefix):
            held.append(target)
    return held


def test_abandon_closes_the_agents_logs_and_the_root_registry(root: Path) -> None:
    async def go() -> None:
        orch = await Orchestrator.open(root)
        await orch.create_root("ada")
        await orch.run_turn("ada", "@spawn kid be useful")
        held = open_fds_under(root)
        assert any("roots" in p for p in held) and any("agents" in p for p in held), held
        abandon(orch)
        assert open_fds_under(root) == []

    asyncio.run(go())


def test_the_lifecycle_fuzzers_kills_leak_no_descriptor() -> None:
    machine = LifecycleMachine()
    for name in ("ada", "bo", "cy", "di"):
        machine.create_root(name)  # opens the new orchestrator's registry log
        machine.reopen(crash=True)
    machine.teardown()
    assert open_fds_under(machine.dir) == []
