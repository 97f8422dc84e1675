"""A real daemon meeting the host's limits while it serves (docs/daemon.md, "Host limits").

The descriptor limit is the one a test can impose on a running daemon for real
(``prlimit`` on its pid, no mount needed): its next ``open`` fails with EMFILE,
the files it has open keep working. That is the case of a committed turn whose
child cannot be created: the commit record is written to a log already open,
the child's session directory and log need new descriptors.
"""

from __future__ import annotations

import os
import resource
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from substrat.client import Client, DaemonProcess
from substrat.errors import RpcError
from substrat.rpc import protocol
from tests.support.cli import cli_root, run
from tests.support.roots import no_wake_daemon

pytestmark = pytest.mark.waits


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    # the roll-forward retried by the agent's next turn, not by the wake loop's timer
    yield from no_wake_daemon(tmp_path / "root")


@contextmanager
def starved(pid: int, spare: int = 0, *, limit: int | None = None) -> Iterator[None]:
    """Within: ``pid``'s open after the next ``spare`` ones fails with EMFILE (a CLI's
    connection takes one); the files it has open keep working. Its limit is put back
    on the way out. ``limit``: that limit instead (3: no open at all succeeds)."""
    old = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    if limit is None:
        used = {int(name) for name in os.listdir(f"/proc/{pid}/fd")}
        free = (n for n in range(len(used) + spare + 1) if n not in used)
        limit = [next(free) for _ in range(spare + 1)][-1]
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (limit, old[1]))
    try:
        yield
    finally:
        resource.prlimit(pid, resource.RLIMIT_NOFILE, old)


def _turns(client: Client, agent: str) -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = client.call("agent.history", {"agent": agent})["turns"]
    return turns


def test_a_committed_turn_whose_child_cannot_be_created_is_reported_committed(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    """Finding o18c-1: the turn commits, creating its child fails (EMFILE); the answer is
    -32015 with ``committed``, never -32603, and the daemon rolls the child forward once
    descriptors are back, without a restart and without a second spawn."""
    root = tmp_path / "root"
    with Client(root, timeout_s=30) as client:
        client.call("agent.create", {"name": "lead"})
        with starved(daemon.pid):
            with pytest.raises(RpcError) as failed:
                client.call("agent.send", {"agent": "lead", "prompt": "@spawn kid do it"})
            assert failed.value.code == protocol.OUTCOME_UNKNOWN, failed.value.message
            data = failed.value.data
            assert isinstance(data, dict) and data["committed"] is True
            assert data["turn_id"] == "t1"
            assert "committed" in failed.value.message
            assert "ulimit -n" in failed.value.message  # what fixes it, with the budget
            status = client.call("daemon.status")
            assert [(u["agent"], u["turn_id"]) for u in status["unapplied"]] == [("lead", "t1")]
            assert status["last_io_error"]["code"] == protocol.OUTCOME_UNKNOWN
            # memory is behind the log: the agent takes no turn until it catches up
            with pytest.raises(RpcError) as refused:
                client.call("agent.send", {"agent": "lead", "prompt": "next"})
            assert refused.value.code == protocol.DURABILITY_FAILED
            assert "not applied yet" in refused.value.message
        # the turn is in the log, once: a user told "committed" does not send it again
        assert [t["turn_id"] for t in _turns(client, "lead")] == ["t1"]
        result = client.call("agent.send", {"agent": "lead", "prompt": "next"})
        assert result["turn_id"] == "t2"  # the refused turn took no number
        tree = client.call("agent.tree")
        assert [c["agent"]["path"] for c in tree[0]["children"]] == ["lead/kid"]
        status = client.call("daemon.status")
        assert status["unapplied"] == []
        client.call("daemon.shutdown")
    assert daemon.proc is not None and daemon.proc.wait(timeout=30) == 0
    lines = (root / "daemon.log").read_text().splitlines()
    assert any("agent.send failed (-32015)" in line for line in lines)
    assert not any("internal error" in line for line in lines)
    # a restart finds nothing left to roll forward: the child was made once, by the retry
    daemon.start(timeout_s=30)
    with Client(root, timeout_s=30) as client:
        assert client.call("daemon.status")["last_recovery"] is None
        tree = client.call("agent.tree")
        assert [c["agent"]["path"] for c in tree[0]["children"]] == ["lead/kid"]


def test_an_agent_create_out_of_descriptors_is_refused_with_what_fixes_it(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    """Finding o18c-5: EMFILE before a commit point is -32011 (it did not happen), with the
    descriptor budget to raise ``ulimit -n`` to; one line in daemon.log, the last one in
    ``daemon status``; the same create works once descriptors are back."""
    root = tmp_path / "root"
    with Client(root, timeout_s=30) as client:
        client.call("agent.create", {"name": "one"})
        with starved(daemon.pid), pytest.raises(RpcError) as failed:
            client.call("agent.create", {"name": "two"})
        assert failed.value.code == protocol.DURABILITY_FAILED, failed.value.message
        assert "raise `ulimit -n`" in failed.value.message
        assert "1 agent: about 82" in failed.value.message
        assert [a["name"] for a in client.call("agent.list")] == ["one"]
        status = client.call("daemon.status")
        assert status["last_io_error"]["method"] == "agent.create"
        assert "Too many open files" in status["last_io_error"]["message"]
        assert client.call("agent.create", {"name": "two"})["name"] == "two"
    lines = (root / "daemon.log").read_text().splitlines()
    refused = [line for line in lines if "agent.create failed (-32011)" in line]
    assert len(refused) == 1 and "ulimit -n" in refused[0]
    assert not any("Traceback" in line for line in lines)


@pytest.fixture
def cli_home(tmp_path: Path) -> Iterator[Path]:
    yield from cli_root(tmp_path)


def test_the_cli_says_committed_not_not_committed_when_a_later_step_fails(
    cli_home: Path,
) -> None:
    """Findings o18c-1 and -7: no "✗ not committed" before an undecided error; a turn that
    committed says so, and that it must not be sent again."""
    assert run(cli_home, "agent", "create", "lead").returncode == 0
    pid = int(run(cli_home, "daemon", "status", "--pid").stdout)
    with starved(pid, spare=1):
        sent = run(cli_home, "agent", "send", "lead", "@spawn kid do it")
    assert sent.returncode != 0
    assert "not committed" not in sent.stderr, sent.stderr
    assert "✓ committed, not fully applied" in sent.stderr
    assert "do not send it again" in sent.stderr
    status = run(cli_home, "daemon", "status")
    assert "lead: turn t1 committed but not applied yet" in status.stdout, status.stdout
    assert "last I/O failure: agent.send" in status.stdout


def test_a_stop_the_host_refuses_is_not_logged_as_a_failed_start(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    """Finding o18c-7: a stop whose session save fails (no descriptor left, as a full disk
    refuses it) says so in daemon.log, not "cannot start"."""
    root = tmp_path / "root"
    with Client(root, timeout_s=30) as client:
        client.call("agent.create", {"name": "a"})
        client.call("agent.send", {"agent": "a", "prompt": "hi"})
        old = resource.prlimit(daemon.pid, resource.RLIMIT_NOFILE)
        # no open at all can succeed (the connections the stop closes free some)
        resource.prlimit(daemon.pid, resource.RLIMIT_NOFILE, (3, old[1]))
        client.call("daemon.shutdown")
    assert daemon.proc is not None and daemon.proc.wait(timeout=30) == 1
    lines = (root / "daemon.log").read_text().splitlines()
    assert not any("cannot start" in line for line in lines), lines
    (stopped,) = [line for line in lines if "stopped without a clean shutdown" in line]
    assert "nothing acknowledged is lost" in stopped and "ulimit -n" in stopped


def test_a_connection_refused_for_lack_of_descriptors_is_one_line_not_tracebacks(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    with starved(daemon.pid, limit=3), socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(root / "daemon.sock"))  # queued; its accept fails (EMFILE)
        _wait_for_line(root / "daemon.log", "out of system resource")
    with Client(root, timeout_s=30) as client:
        assert client.call("ping")["pong"] is True  # accepts again, nothing to restart
    lines = (root / "daemon.log").read_text().splitlines()
    refused = [line for line in lines if "out of system resource" in line]
    assert len(refused) == 1 and "raise `ulimit -n`" in refused[0], refused
    assert not any("Traceback" in line for line in lines)


def _wait_for_line(path: Path, text: str) -> None:
    for _ in range(300):
        if text in path.read_text():
            return
        time.sleep(0.1)
    raise AssertionError(f"no {text!r} in {path}")


def test_the_wake_loop_rolls_a_committed_turn_forward_without_another_turn(
    tmp_path: Path,
) -> None:
    """The roll-forward does not wait for the agent's next turn: the wake loop applies it
    again every few seconds, as a restart's recovery would, until the host takes it."""
    root = tmp_path / "root"
    process = DaemonProcess(root)
    process.start(timeout_s=30)
    try:
        with Client(root, timeout_s=30) as client:
            client.call("agent.create", {"name": "lead"})
            with starved(process.pid), pytest.raises(RpcError) as failed:
                client.call("agent.send", {"agent": "lead", "prompt": "@spawn kid do it"})
            assert failed.value.code == protocol.OUTCOME_UNKNOWN
            for _ in range(600):
                if client.call("daemon.status")["unapplied"] == []:
                    break
                time.sleep(0.1)
            tree = client.call("agent.tree")
            assert [c["agent"]["path"] for c in tree[0]["children"]] == ["lead/kid"]
            assert [t["turn_id"] for t in _turns(client, "lead")] == ["t1"]
    finally:
        process.kill()
