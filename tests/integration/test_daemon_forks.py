"""The SIGKILL campaign's forked daemons (tests/support/daemon_forks.py) are real daemons:
each answers as its own process, dies at a SIGKILL without a clean shutdown, and a start
that fails says so."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from substrat.client import Client
from substrat.daemon import EXIT_LOCKED
from substrat.errors import DaemonStartError
from tests.support.daemon_forks import DaemonForks, ForkedDaemon


@pytest.fixture(scope="module")
def forks() -> Iterator[DaemonForks]:
    """One forking process for the tests below, as the stress campaign's items share one."""
    with DaemonForks() as started:
        yield started


def test_a_forked_daemon_serves_dies_at_sigkill_and_its_restart_sees_the_crash(
    tmp_path: Path, forks: DaemonForks
) -> None:
    root = tmp_path / "root"
    first = ForkedDaemon(forks, root).start(timeout_s=30)
    assert first.pid is not None and first.pid not in (os.getpid(), forks.proc.pid)
    with Client(root) as client:
        assert client.call("ping")["pid"] == first.pid
        agent = client.call("agent.create", {"name": "kept", "provider": "scripted"})
    first.kill()
    assert first.status == -9
    second = ForkedDaemon(forks, root).start(timeout_s=30)
    try:
        with Client(root) as client:
            assert client.call("daemon.status")["last_recovery"]["previous_shutdown"] == "unclean"
            assert [a["agent_id"] for a in client.call("agent.list")] == [agent["agent_id"]]
    finally:
        second.kill()


def test_a_forked_start_that_fails_says_how(tmp_path: Path, forks: DaemonForks) -> None:
    root = tmp_path / "root"
    holder = ForkedDaemon(forks, root).start(timeout_s=30)
    try:
        with pytest.raises(DaemonStartError, match=f"exited with status {EXIT_LOCKED}"):
            ForkedDaemon(forks, root).start(timeout_s=30)
    finally:
        holder.kill()


def test_closed_forks_leave_no_pipe_open() -> None:
    """An unclosed pipe is a ResourceWarning: under PYTHONWARNINGS=error it failed the
    tests that used the forks (3.13, 4 tests)."""
    forks = DaemonForks()
    forks.close()
    assert forks.proc.stdin is not None and forks.proc.stdout is not None
    assert forks.proc.stdin.closed and forks.proc.stdout.closed


def test_a_campaign_forks_its_daemons_off_the_forks_it_is_given_and_leaves_them_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, forks: DaemonForks
) -> None:
    """The stress campaign's items share one forking process (a module's fixture): each
    campaign starts its daemons from it and leaves it open for the next."""
    from tests.integration.test_daemon_crash_campaign import run_campaign

    asked: list[str] = []
    real = forks.ask

    def ask(*request: object) -> object:
        asked.append(str(request[0]))
        return real(*request)

    monkeypatch.setattr(forks, "ask", ask)
    stats = run_campaign(
        tmp_path / "root", cycles=1, workers=1, seed=5, max_run_s=0.05, forks=forks
    )
    assert stats.problems == [] and stats.cycles == 1
    assert asked.count("start") == 2  # the cycle's daemon, then the final check's
    assert forks.proc.poll() is None  # open for the next campaign
    ForkedDaemon(forks, tmp_path / "next").start(timeout_s=30).kill()
