"""An agent the start cannot use because of the host (a full disk, a descriptor limit),
not because of its files: the advice fixes the host, and the agent is named as held
back wherever it is asked for (docs/daemon.md, "Host limits"; finding o18c-2).

A full disk or a descriptor limit cannot be set up for one log in a test, so the
failure is injected at the seam the start reads through (``os.open`` in
substrat.checkpoints), as tests/integration/test_unreadable_agent.py does for EIO.
"""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path

import pytest

from substrat import access
from substrat.checkpoints import CHECKPOINTS_DIR
from substrat.errors import AgentNotFoundError, DurabilityError
from substrat.orchestrator import Orchestrator
from tests.support import roots


def test_a_failed_atomic_write_on_a_full_disk_says_free_space_not_fix_the_directory() -> None:
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    try:
        raise DurabilityError("atomic write of agents/x/session.json failed") from full
    except DurabilityError as exc:
        item = access.unreadable("x" * 32, "/r/agents/x", exc, then="restart the daemon")
    assert item.what_to_do.startswith("the disk is full: free space"), item.what_to_do
    assert "then restart the daemon" in item.what_to_do
    assert "fix " not in item.what_to_do
    assert "ENOSPC" in item.error


def test_an_agent_held_back_by_a_descriptor_limit_is_named_not_unknown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "root"
    sessions = asyncio.run(roots.three_roots(root))
    assert (root / CHECKPOINTS_DIR).is_dir()
    roots.fail_checkpoint_open(monkeypatch, root, sessions["beta"], errno.EMFILE)

    async def reopen() -> None:
        orch = await Orchestrator.open(root)
        try:
            report = orch.recovery_report
            assert report is not None
            (item,) = report.unreadable
            assert "raise `ulimit -n`" in item.what_to_do, item.what_to_do
            for ref in ("beta", sessions["beta"][:8]):
                with pytest.raises(AgentNotFoundError) as missing:
                    orch.get(ref)
                message = str(missing.value)
                assert f"agent {ref} is held back since the daemon started" in message
                assert "raise `ulimit -n`" in message
            with pytest.raises(AgentNotFoundError, match="no agent nobody"):
                orch.get("nobody")
        finally:
            await orch.close()

    asyncio.run(reopen())
