"""One process at a time has a root open: another opener is refused before it reads anything.

Two orchestrators on one root each recover it and then write the same logs
with their own counters: both hand out the same turn ids and ``seq`` numbers,
each calls the other's turn in flight lost, and a repair of the duplicate lines
then removes acknowledged turns (an outside review did exactly this with two
processes, and with an application beside the root's daemon). The hold is a
``flock`` on the root directory (substrat.root_hold), taken by every opener:
an application, the daemon, fsck, recover, compact.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from oracle.kill import abandon
from substrat.errors import RootLockedError
from substrat.orchestrator import Orchestrator
from substrat.rpc import lock
from tests.support import roots
from tests.support.cli import stop_or_kill


async def _turns(root: Path, agent: str) -> list[str]:
    orch = await Orchestrator.open(root)
    try:
        return [t.prompt for t in orch.history(agent)]
    finally:
        await orch.close()


def test_a_process_keeps_its_root_from_others_until_its_orchestrator_goes(root: Path) -> None:
    async def scenario() -> None:
        first = await Orchestrator.open(root)
        await first.create_root("app", "You help.")
        await first.run_turn("app", "one")
        assert roots.other_process_opens(root).startswith("refused: ")
        await first.close()
        assert roots.other_process_opens(root) == "opened"
        killed = await Orchestrator.open(root)
        assert roots.other_process_opens(root).startswith("refused: ")
        abandon(killed)  # a kill -9: the kernel drops its hold with the process
        assert roots.other_process_opens(root) == "opened"
        assert await _turns(root, "app") == ["one"]

    asyncio.run(scenario())


def test_a_second_orchestrator_in_the_same_process_is_refused(root: Path) -> None:
    """Two orchestrators of one program on one root hand out the same turn ids and seqs
    as two processes do: the second open is refused before it reads anything, and the
    first one's turns stay whole."""

    async def scenario() -> None:
        first = await Orchestrator.open(root)
        await first.create_root("app", "You help.")
        await first.run_turn("app", "one")
        with pytest.raises(RootLockedError, match="another Orchestrator of this process"):
            await Orchestrator.open(root)
        await first.run_turn("app", "two")  # the refused open took nothing from it
        await first.close()
        second = await Orchestrator.open(root)  # closed: the root may be opened again
        try:
            assert [t.prompt for t in second.history("app")] == ["one", "two"]
            assert [t.turn_id for t in second.history("app")] == ["t1", "t2"]
        finally:
            await second.close()

    asyncio.run(scenario())
    assert roots.cli(root, "fsck").returncode == 0


CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from substrat.orchestrator import Orchestrator

    async def main():
        orch = await Orchestrator.open(sys.argv[1])
        await orch.create_root("app", "You help.")
        await orch.run_turn("app", "from the child")
        print("open", flush=True)
        sys.stdin.readline()  # held until the parent says so
        await orch.close()
        print("closed", flush=True)

    asyncio.run(main())
    """
)


def test_a_root_open_in_another_process_is_refused(root: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "open"
        with pytest.raises(RootLockedError, match="already open: in another process"):
            asyncio.run(Orchestrator.open(root))
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "closed"
    finally:
        child.kill() if child.poll() is None else None
        child.wait(timeout=60)
    assert asyncio.run(_turns(root, "app")) == ["from the child"]


def test_an_application_cannot_open_the_root_its_daemon_serves(root: Path) -> None:
    asyncio.run(roots.three_roots(root))
    try:
        assert roots.cli(root, "daemon", "start").returncode == 0
        pid = json.loads(roots.cli(root, "daemon", "status").stdout)["pid"]
        with pytest.raises(RootLockedError, match=f"open in daemon pid {pid}"):
            asyncio.run(Orchestrator.open(root))
        sent = roots.cli(root, "agent", "send", "beta", "still served")
        assert sent.returncode == 0, sent.stderr
    finally:
        stop_or_kill(root)
    assert roots.cli(root, "fsck").returncode == 0


def test_the_daemon_and_fsck_refuse_a_root_an_application_has_open(root: Path) -> None:
    asyncio.run(roots.three_roots(root))
    before = lock.read_info(root)

    async def scenario() -> None:
        orch = await Orchestrator.open(root)
        try:
            started = roots.cli(root, "daemon", "start", as_json=False)
            assert started.returncode != 0, started.stdout
            assert "already open: in another process" in started.stdout + started.stderr
            checked = roots.cli(root, "fsck", as_json=False)
            assert checked.returncode == 2, checked.stdout + checked.stderr
            assert "already open: in another process" in checked.stdout + checked.stderr
            assert not lock.is_held(root)
        finally:
            await orch.close()

    asyncio.run(scenario())
    # the refused daemon left the lock file's shutdown record as it was
    assert lock.read_info(root) == before
    try:
        assert roots.cli(root, "daemon", "start").returncode == 0
        status = json.loads(roots.cli(root, "daemon", "status").stdout)
        assert status["previous_shutdown"] != "unclean", status
    finally:
        stop_or_kill(root)


def test_a_closed_orchestrator_writes_nothing(root: Path) -> None:
    """After close() gave the root back, another opener may have it: every call that would
    write refuses, and the root is left exactly as the close left it."""
    from substrat.errors import OrchestratorClosedError
    from tests.integration.test_cli_root import snapshot

    async def scenario() -> None:
        orch = await Orchestrator.open(root)
        await orch.create_root("app", "You help.")
        await orch.run_turn("app", "one")
        await orch.close()
        before = snapshot(root)
        for call in (
            lambda: orch.run_turn("app", "two"),
            lambda: orch.create_root("other", "x"),
            lambda: orch.terminate("app"),
        ):
            with pytest.raises(OrchestratorClosedError, match=r"Orchestrator\.open"):
                await call()
        await orch.close()  # a second close is harmless
        assert snapshot(root) == before

    asyncio.run(scenario())
    assert roots.cli(root, "fsck").returncode == 0


def test_a_file_system_without_directory_locks_still_serves_the_root(
    root: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """NFS cannot flock a directory (EBADF: its emulation needs a descriptor open for
    writing). The root is served as before the hold existed, with a warning. Simulated by
    making flock answer EBADF: no NFS server is available to these tests."""
    import errno

    from substrat import root_hold

    def no_directory_locks(fd: int, operation: int) -> None:
        raise OSError(errno.EBADF, "Bad file descriptor")

    monkeypatch.setattr(root_hold.fcntl, "flock", no_directory_locks)

    async def scenario() -> None:
        orch = await Orchestrator.open(root)
        await orch.create_root("app", "You help.")
        await orch.run_turn("app", "one")
        await orch.close()

    with caplog.at_level("WARNING", logger="substrat.root_hold"):
        asyncio.run(scenario())
    assert "cannot lock a directory" in caplog.text
    monkeypatch.undo()
    assert asyncio.run(_turns(root, "app")) == ["one"]
