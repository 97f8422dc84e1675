"""A creation or termination whose steps after its commit point fail in a real daemon
(its descriptor limit lowered with ``prlimit``, as in test_daemon_host_limits): the
daemon finishes it itself, before the agent's next use and from the wake loop, as it
does a turn's effects, instead of listing it for a restart (docs/daemon.md, "Host
limits")."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from substrat.client import Client, DaemonProcess
from substrat.errors import RpcError
from substrat.rpc import protocol
from tests.integration.test_daemon_host_limits import starved
from tests.support.roots import no_wake_daemon

pytestmark = pytest.mark.waits


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    # only the agent's next use finishes it (the wake loop's timer: the last test)
    yield from no_wake_daemon(tmp_path / "root")


def _unfinished(client: Client) -> list[str]:
    return [u["what"] for u in client.call("daemon.status")["unfinished"]]


def _registered(root: Path) -> int:
    """How many roots the root registry's log has registered (0 with no log yet)."""
    log = root / "roots" / "events.jsonl"
    return log.read_bytes().count(b'"root.registered"') if log.exists() else 0


def _cascade_cut_after_its_commit(client: Client, pid: int) -> None:
    """lead and lead/kid; terminating lead commits (its log is open), the records of
    the terminated sessions need descriptors the daemon no longer has."""
    client.call("agent.create", {"name": "lead"})
    client.call("agent.send", {"agent": "lead", "prompt": "@spawn kid do it"})
    with starved(pid), pytest.raises(RpcError) as failed:
        client.call("agent.terminate", {"agent": "lead", "cascade": True})
    assert failed.value.code == protocol.OUTCOME_UNKNOWN, failed.value.message
    assert isinstance(failed.value.data, dict) and failed.value.data["committed"] is True
    assert "the daemon finishes it before that agent is next used" in failed.value.message
    assert "ulimit -n" in failed.value.message  # what fixes the host


def test_a_termination_cut_after_its_commit_is_finished_at_the_agents_next_use(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    with Client(root, timeout_s=30) as client:
        _cascade_cut_after_its_commit(client, daemon.pid)
        assert _unfinished(client) == ["agent lead was terminated"]
        # descriptors back: the next use finishes the termination first, then refuses
        # (until then it is refused as terminated too: test_after_commit_failures)
        with pytest.raises(RpcError) as gone:
            client.call("agent.send", {"agent": "lead/kid", "prompt": "hi"})
        assert "was terminated at" in gone.value.message, gone.value.message
        assert _unfinished(client) == []
        assert client.call("agent.list") == []
        client.call("daemon.shutdown")
    assert daemon.proc is not None and daemon.proc.wait(timeout=30) == 0
    daemon.start(timeout_s=30)  # nothing was left for a restart's recovery
    with Client(root, timeout_s=30) as client:
        assert client.call("daemon.status")["last_recovery"] is None
        assert client.call("agent.list") == []


def test_a_creation_cut_after_its_commit_is_finished_at_the_agents_next_turn(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    with Client(root, timeout_s=30) as client:
        # An answer first: the connection is then accepted, not waiting in the listen
        # queue for an accept() that the starvation below would fail (EMFILE) for 30 s.
        client.call("ping")
        # The fewest spare descriptors with which the first creation commits: with fewer
        # it is refused before its commit point (-32011, nothing created, as the
        # host-limits test shows); then the registration, which opens the root
        # registry's log (not open yet: no root was created before), is what finds none.
        # (Its session record is not written after the commit: ACTIVE is never written.)
        for spare in range(40):
            with starved(daemon.pid, spare), pytest.raises(RpcError) as failed:
                client.call("agent.create", {"name": f"two{spare}"})
            if failed.value.code != protocol.DURABILITY_FAILED:
                break
        assert failed.value.code == protocol.OUTCOME_UNKNOWN, failed.value.message
        assert isinstance(failed.value.data, dict) and failed.value.data["committed"] is True
        name = f"two{spare}"
        assert _unfinished(client) == [f"agent {name} was created"]
        listed = {a["name"]: a for a in client.call("agent.list")}
        assert list(listed) == [name]
        assert _registered(root) == 0
        # the next turn finishes the creation first (refused until then: see
        # test_after_commit_failures), then runs
        assert client.call("agent.send", {"agent": name, "prompt": "hi"})["turn_id"] == "t1"
        assert _unfinished(client) == []
        assert _registered(root) == 1  # by this daemon
        record = root / "agents" / listed[name]["session_id"] / "session.json"
        assert json.loads(record.read_text())["state"] == "created"  # live, not rewritten
        client.call("daemon.shutdown")
    assert daemon.proc is not None and daemon.proc.wait(timeout=30) == 0
    assert json.loads(record.read_text())["state"] == "suspended"  # by the clean stop
    daemon.start(timeout_s=30)
    with Client(root, timeout_s=30) as client:
        assert [a["name"] for a in client.call("agent.list")] == [name]
        status = client.call("daemon.status")
        assert status["roots"] == 1, status["roots"]


def test_a_creation_refused_before_its_commit_leaves_nothing(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    """Each refusal (-32011) with too few descriptors, at each step before the commit
    point (the session directory, its record, its log), takes back what it made: no
    orphan session for the next start's recovery to terminate, nothing in the root."""
    root = tmp_path / "root"
    with Client(root, timeout_s=30) as client:
        client.call("agent.create", {"name": "one"})
        made = sorted((root / "agents").iterdir())
        refused = 0
        for spare in range(40):
            with starved(daemon.pid, spare):
                try:
                    client.call("agent.create", {"name": f"two{spare}"})
                except RpcError as failed:
                    assert failed.code == protocol.DURABILITY_FAILED, failed.message
                    assert "nothing of it was done" in failed.message, failed.message
                    assert sorted((root / "agents").iterdir()) == made, spare
                    refused += 1
                    continue
            break
        assert refused >= 2  # the directory's and the log's refusals at least
        # the first that commits is the one agent more, and whole: after its commit
        # point nothing needs a descriptor (the registry's log is open, the record is
        # not written again)
        assert _unfinished(client) == []
        client.call("daemon.shutdown")
    assert daemon.proc is not None and daemon.proc.wait(timeout=30) == 0
    daemon.start(timeout_s=30)
    with Client(root, timeout_s=30) as client:
        recovery = client.call("daemon.status")["last_recovery"]
        assert recovery is None or not recovery.get("orphans_terminated"), recovery
        listed = {a["name"]: a["session_id"] for a in client.call("agent.list")}
    assert list(listed) == ["one", f"two{spare}"]
    made.append(root / "agents" / listed[f"two{spare}"])
    assert sorted((root / "agents").iterdir()) == sorted(made)


def test_the_wake_loop_finishes_a_termination_without_another_use(tmp_path: Path) -> None:
    root = tmp_path / "root"
    process = DaemonProcess(root)
    process.start(timeout_s=30)
    try:
        with Client(root, timeout_s=30) as client:
            _cascade_cut_after_its_commit(client, process.pid)
            for _ in range(600):
                if _unfinished(client) == []:
                    break
                time.sleep(0.1)
            assert _unfinished(client) == []
            assert client.call("agent.list") == []
    finally:
        process.kill()
