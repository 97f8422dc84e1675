"""A daemon start on a root an application holds writes nothing into it.

Outside review s21f (F8): with an application holding a library root
(``Orchestrator.open``), ``substrat --root R agent create x`` failed cleanly (exit 3)
but left ``substrat-root.json``, ``daemon.lock`` and ``daemon.log`` in R: the command
made the root ready (marker, start lock on the log) and the daemon created its lock
file before either met the hold. A root the daemon cannot hold is somebody else's
right now: nothing of a start may land in it, and the refusal names the holder and
what to do.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from substrat import daemon
from substrat.errors import RootError
from substrat.orchestrator import Orchestrator
from tests.support import roots


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every name under ``root`` with its size and modification time (ns)."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            st = path.lstat()
            found[str(path.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return found


START_COMMANDS = [
    pytest.param(("agent", "create", "x"), id="autostart"),
    pytest.param(("daemon", "start"), id="daemon-start"),
    pytest.param(("daemon", "start", "--foreground"), id="foreground"),
    pytest.param(("daemon", "restart"), id="restart"),
]


@pytest.mark.parametrize("command", START_COMMANDS)
def test_a_start_on_a_root_an_application_holds_writes_nothing(
    root: Path, command: tuple[str, ...]
) -> None:
    asyncio.run(roots.three_roots(root))  # a library root: no marker, no daemon files

    async def scenario() -> None:
        orch = await Orchestrator.open(root)
        try:
            before = _tree(root)
            refused = roots.cli(root, *command, as_json=False)
            assert refused.returncode == daemon.EXIT_LOCKED, refused.stdout + refused.stderr
            said = " ".join((refused.stdout + refused.stderr).split())
            assert f"pid {os.getpid()}" in said, said  # who holds it
            assert "Orchestrator.close" in said, said  # what to do
            assert "nothing was written" in said, said
            assert _tree(root) == before
        finally:
            await orch.close()

    asyncio.run(scenario())
    for name in ("substrat-root.json", "daemon.lock", "daemon.log"):
        assert not (root / name).exists(), name


def test_the_daemon_itself_writes_nothing_into_a_held_root(root: Path) -> None:
    """``python -m substrat.daemon`` (what a start spawns): its lock file and the marker
    come after its hold, so a daemon started by hand beside an application writes nothing."""
    asyncio.run(roots.three_roots(root))

    async def scenario() -> None:
        orch = await Orchestrator.open(root)
        try:
            before = _tree(root)
            ran = subprocess.run(
                [sys.executable, "-m", "substrat.daemon", "--root", str(root)],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert ran.returncode == daemon.EXIT_LOCKED, ran.stderr
            assert "already open" in ran.stderr, ran.stderr
            assert _tree(root) == before
        finally:
            await orch.close()

    asyncio.run(scenario())


def test_the_daemon_holds_the_root_from_before_its_first_write(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No window between the daemon's look at the hold and its hold for good: while it makes
    the root ready (its marker), an application that opens the root is refused, so it cannot
    find the daemon's files in a root it holds."""
    asyncio.run(roots.three_roots(root))
    seen: list[str] = []

    def prepare(path: Path) -> Path:
        seen.append(roots.other_process_opens(path))
        raise RootError("stop the start here")  # main() answers EXIT_USAGE, nothing served

    monkeypatch.setattr(daemon, "prepare_root", prepare)
    assert daemon.main(["--root", str(root)]) == daemon.EXIT_USAGE
    assert len(seen) == 1 and seen[0].startswith("refused: root "), seen
    assert roots.other_process_opens(root) == "opened"  # and main() let go of it
