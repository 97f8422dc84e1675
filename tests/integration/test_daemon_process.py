"""The daemon as a real process: lock, permissions, peer uid, signals, recovery notice."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from substrat.client import Client, DaemonProcess
from substrat.errors import DaemonDiedError, RootPermissionError, RpcError
from substrat.rootdir import prepare_root
from substrat.rpc import lock, protocol
from substrat.rpc.transport import MAX_SUN_PATH_BYTES, socket_path
from substrat.session import SessionState, SessionStore
from tests.support.cli import wait_busy

Start = Callable[..., DaemonProcess]
OTHER_UID = 65534  # "nobody"


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Start]:
    """Start daemons as child processes; every one is killed at teardown."""
    started: list[DaemonProcess] = []

    def _start(root: Path | None = None, *args: str) -> DaemonProcess:
        daemon = DaemonProcess(root or tmp_path / "root", daemon_args=list(args))
        started.append(daemon)
        return daemon.start(timeout_s=30)

    yield _start
    for daemon in started:
        daemon.kill()


def test_second_daemon_on_the_same_root_is_refused(start: Start, tmp_path: Path) -> None:
    first = start()
    second = subprocess.run(
        [sys.executable, "-m", "substrat.daemon", "--root", str(tmp_path / "root")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert second.returncode == 3
    assert f"in use by daemon pid {first.pid}" in second.stderr
    assert first.alive()
    with Client(tmp_path / "root") as client:
        assert client.call("ping")["pid"] == first.pid


def test_root_and_socket_permissions(start: Start, tmp_path: Path) -> None:
    root = tmp_path / "loose"
    start(root).terminate()
    os.chmod(root, 0o755)  # a root of ours, loosened since: tightened again
    start(root)
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o700
    sock = socket_path(root)
    assert stat.S_ISSOCK(os.lstat(sock).st_mode)
    assert stat.S_IMODE(os.lstat(sock).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(lock.lock_path(root)).st_mode) == 0o600


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to chown a directory to another uid")
def test_root_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "theirs"
    root.mkdir()
    os.chown(root, OTHER_UID, OTHER_UID)
    with pytest.raises(RootPermissionError, match="belongs to uid 65534"):
        prepare_root(root)
    proc = subprocess.run(
        [sys.executable, "-m", "substrat.daemon", "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2
    assert "belongs to uid 65534" in proc.stderr


def _connect_as(uid: int, path: Path) -> dict[str, Any]:
    """Fork, drop to ``uid``, connect and report what happened (no exec: /root is private)."""
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():
        # 3.12+ warns that a fork with threads running may deadlock the child (an error
        # under PYTHONWARNINGS=error); this child only connects a socket, writes a pipe, _exits.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # child
        result: dict[str, Any]
        try:
            os.close(read_end)
            os.setgid(uid)
            os.setuid(uid)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(10)
            try:
                sock.connect(str(path))
            except OSError as exc:
                result = {"connect_error": exc.errno}
            else:
                # Send nothing: a refused peer is told so at once and hung up on
                # (writing first would race the hang-up into EPIPE).
                data = b""
                while True:
                    chunk = sock.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                result = {"lines": data.decode().splitlines(), "closed": True}
        except BaseException as exc:  # report, never raise: this is a forked child
            result = {"child_error": f"{type(exc).__name__}: {exc}"}
        try:
            os.write(write_end, json.dumps(result).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        raw = pipe.read()
    os.waitpid(pid, 0)
    return json.loads(raw)


@pytest.mark.skipif(
    os.getuid() != 0, reason="acting as another uid needs root (setuid in a forked child)"
)
def test_connection_from_another_uid_is_refused(start: Start, tmp_path: Path) -> None:
    root = Path(f"/tmp/substrat-uid-{os.getpid()}")  # short: the child connects by real path
    try:
        start(root)
        sock = socket_path(root)
        # 1. As deployed, the private root and socket keep other users out at connect().
        assert _connect_as(OTHER_UID, sock) == {"connect_error": errno.EACCES}
        # 2. With the permissions opened on purpose, the peer-uid check still refuses.
        os.chmod(root, 0o755)
        os.chmod(sock, 0o777)
        outcome = _connect_as(OTHER_UID, sock)
        assert outcome.get("closed") is True, outcome
        assert len(outcome["lines"]) == 1
        refusal = json.loads(outcome["lines"][0])
        assert refusal["error"]["code"] == protocol.PERMISSION_DENIED
        assert "connection from uid 65534" in refusal["error"]["message"]
        with Client(root) as client:  # the owner is still served
            assert client.call("daemon.status")["refused_connections"] == 1
    finally:
        subprocess.run(["rm", "-rf", str(root)], check=False)


def test_long_root_path_is_reached_through_a_short_alias(start: Start, tmp_path: Path) -> None:
    root = tmp_path / ("deep-" * 30) / "root"
    assert len(os.fsencode(socket_path(root))) > MAX_SUN_PATH_BYTES
    daemon = start(root)
    with Client(root) as client:
        assert client.call("ping")["pid"] == daemon.pid


def test_sigterm_suspends_sessions_and_exits_cleanly(start: Start, tmp_path: Path) -> None:
    root = tmp_path / "root"
    daemon = start(root)
    with Client(root) as client:
        info = client.call("agent.create", {"name": "alpha"})
        client.call("agent.send", {"agent": "alpha", "prompt": "hello"})
        assert client.call("agent.show", {"agent": "alpha"})["live"] is True
    assert daemon.terminate() == 0
    record = SessionStore(root).load(info["session_id"])
    assert record.state is SessionState.SUSPENDED
    assert record.provider_state, "the provider blob was saved on the way out"
    assert lock.read_info(root).state == "stopped"  # type: ignore[union-attr]
    assert not os.path.lexists(socket_path(root))
    again = start(root)
    with Client(root) as client:
        status = client.call("daemon.status")
        assert status["previous_shutdown"] == "clean"
        assert status["last_recovery"] is None
        assert client.call("agent.history", {"agent": "alpha"})["total"] == 1
    assert again.terminate() == 0


LOST_ONE = "lost one\n@pace 5000ms"


def test_sigkill_mid_turn_is_reported_to_client_and_subscribers(
    start: Start, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    daemon = start(root)
    with Client(root) as client:
        client.call("agent.create", {"name": "slow", "provider": "paced"})
        acked = client.call("agent.send", {"agent": "slow", "prompt": "@send user first"})
    # @pace 5000ms: the second turn is surely in flight when the kill lands (the first took
    # the agent's own 20 ms).
    outcome: dict[str, Any] = {}

    def second_turn() -> None:
        try:
            with Client(root, timeout_s=30) as client:
                client.call("agent.send", {"agent": "slow", "prompt": LOST_ONE})
        except DaemonDiedError as exc:
            outcome["error"] = str(exc)

    worker = threading.Thread(target=second_turn)
    worker.start()
    wait_busy(root)  # its turn.start is logged: the kill leaves it lost in flight
    daemon.kill()
    worker.join(30)
    assert "died (crashed or was killed)" in outcome["error"]
    assert "may or may not have been applied" in outcome["error"]
    assert lock.read_info(root).state == "running"  # type: ignore[union-attr]
    assert os.path.lexists(socket_path(root))  # a stale socket is left behind...
    restarted = start(root)  # ...and replaced
    with Client(root) as client:
        client.call("events.subscribe", {"events": ["daemon.recovered"]})
        method, notice = client.next_notification(5.0) or ("none", {})
        assert method == "daemon.recovered"
        assert notice["previous_shutdown"] == "unclean"
        assert notice["pid"] == restarted.pid
        lost = notice["report"]["lost_turns"]
        assert [(t["turn_id"], t["prompt"]) for t in lost] == [("t2", LOST_ONE)]
        assert client.call("daemon.status")["last_recovery"] == notice
        history = client.call("agent.history", {"agent": "slow"})["turns"]
        assert [(t["turn_id"], t["response"]) for t in history] == [
            (acked["turn_id"], acked["response"])
        ]
        assert [m["payload"] for m in client.call("inbox.list")["messages"]] == ["first"]


def _busy(root: Path) -> bool:
    with Client(root) as client:
        return bool(client.call("daemon.status")["busy_turns"])


def _wait_for(condition: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_heartbeats_reach_subscribers(start: Start, tmp_path: Path) -> None:
    root = tmp_path / "root"
    daemon = start(root, "--heartbeat-s", "0.1")
    with Client(root) as client:
        answer = client.call("events.subscribe", {"events": ["daemon.heartbeat"]})
        assert answer["heartbeat_s"] == 0.1
        beats = [client.next_notification(2.0) for _ in range(3)]
    assert all(b is not None and b[0] == "daemon.heartbeat" for b in beats)
    assert {b[1]["pid"] for b in beats if b is not None} == {daemon.pid}


def test_concurrent_turn_limit_over_rpc(start: Start, tmp_path: Path) -> None:
    root = tmp_path / "root"
    start(root, "--max-turns", "1")
    with Client(root) as client:
        for name in ("a", "b"):
            client.call("agent.create", {"name": name, "provider": "paced", "model": "1200ms"})
    results: dict[str, Any] = {}

    def turn() -> None:
        with Client(root, timeout_s=30) as client:
            results["a"] = client.call("agent.send", {"agent": "a", "prompt": "x"})

    worker = threading.Thread(target=turn)
    worker.start()
    _wait_for(lambda: _busy(root), 10)
    with Client(root) as client, pytest.raises(RpcError) as refused:
        client.call("agent.send", {"agent": "b", "prompt": "y"})
    worker.join(30)
    assert refused.value.code == protocol.TOO_MANY_TURNS
    assert results["a"]["turn_id"] == "t1"


def test_agents_events_and_inbox_over_rpc(start: Start, tmp_path: Path) -> None:
    root = tmp_path / "root"
    start(root)
    with Client(root) as watcher, Client(root) as client:
        watcher.call("events.subscribe", {"events": ["agent.created", "turn.completed"]})
        lead = client.call("agent.create", {"name": "lead", "instructions": "lead"})
        chunks: list[str] = []
        result = client.call(
            "agent.send",
            {"agent": "lead", "prompt": "@spawn kid help\n@send user hi there", "stream": True},
            on_notification=lambda m, p: chunks.append(p["text"]),
        )
        assert "".join(chunks) == result["response"]
        assert len(result["spawned"]) == 1
        kid = result["spawned"][0]
        seen = [watcher.next_notification(5.0) for _ in range(3)]
        assert [s[0] for s in seen if s] == ["agent.created", "agent.created", "turn.completed"]
        tree = client.call("agent.tree")
        assert tree[0]["agent"]["agent_id"] == lead["agent_id"]
        assert tree[0]["children"][0]["agent"]["path"] == "lead/kid"
        assert client.call("agent.show", {"agent": "lead/kid"})["agent"]["agent_id"] == kid
        inbox = client.call("inbox.list")["messages"]
        assert [(m["sender"], m["payload"]) for m in inbox] == [(lead["agent_id"], "hi there")]
        acked = client.call("inbox.ack", {"message_ids": [inbox[0]["message_id"]]})
        assert acked["acknowledged"] == [inbox[0]["message_id"]]
        assert client.call("inbox.list")["messages"] == []
        with pytest.raises(RpcError) as busy_parent:
            client.call("agent.terminate", {"agent": "lead"})
        assert busy_parent.value.code == protocol.HAS_CHILDREN
        gone = client.call("agent.terminate", {"agent": "lead", "cascade": True})
        assert gone["terminated"] == [kid, lead["agent_id"]]
        # A terminated agent can be read (its log is kept), not sent to.
        assert client.call("agent.show", {"agent": "lead"})["agent"]["state"] == "terminated"
        with pytest.raises(RpcError) as terminated:
            client.call("agent.send", {"agent": "lead", "prompt": "still there?"})
        assert terminated.value.code == protocol.AGENT_REFUSED
        assert terminated.value.data["type"] == "AgentTerminatedError"
        with pytest.raises(RpcError) as missing:
            client.call("agent.show", {"agent": "nobody"})
        assert missing.value.code == protocol.AGENT_NOT_FOUND
        with pytest.raises(RpcError) as bad_name:
            client.call("agent.create", {"name": "no spaces allowed"})
        assert bad_name.value.code == protocol.INVALID_PARAMS


def test_shutdown_request_stops_the_daemon(start: Start, tmp_path: Path) -> None:
    root = tmp_path / "root"
    daemon = start(root)
    with Client(root) as client:
        client.call("events.subscribe", {"events": ["daemon.stopping"]})
        assert client.call("daemon.shutdown")["pid"] == daemon.pid
        note = client.next_notification(5.0)
        assert note is not None and note[0] == "daemon.stopping"
    assert daemon.wait(30) == 0
    assert lock.read_info(root).state == "stopped"  # type: ignore[union-attr]


def _send_in_thread(
    root: Path, agent: str, prompt: str, outcome: dict[str, Any]
) -> threading.Thread:
    def turn() -> None:
        try:
            with Client(root, timeout_s=30) as client:
                outcome["result"] = client.call("agent.send", {"agent": agent, "prompt": prompt})
        except RpcError as exc:
            outcome["code"] = exc.code
        except DaemonDiedError as exc:
            outcome["died"] = str(exc)

    worker = threading.Thread(target=turn)
    worker.start()
    return worker


def test_sigterm_lets_a_running_turn_finish_within_the_grace(start: Start, tmp_path: Path) -> None:
    root = tmp_path / "root"
    daemon = start(root, "--grace-s", "10")
    with Client(root) as client:
        client.call("agent.create", {"name": "a", "provider": "paced", "model": "600ms"})
    outcome: dict[str, Any] = {}
    worker = _send_in_thread(root, "a", "finish me", outcome)
    _wait_for(lambda: _busy(root), 10)
    assert daemon.proc is not None
    daemon.proc.send_signal(signal.SIGTERM)
    worker.join(30)
    assert daemon.wait(30) == 0
    assert outcome["result"]["prompt"] == "finish me"  # acknowledged before the exit
    start(root)
    with Client(root) as client:
        turns = client.call("agent.history", {"agent": "a"})["turns"]
        assert [t["response"] for t in turns] == [outcome["result"]["response"]]


def test_sigterm_cancels_a_turn_past_the_grace_and_says_so(start: Start, tmp_path: Path) -> None:
    root = tmp_path / "root"
    daemon = start(root, "--grace-s", "0.2")
    with Client(root) as client:
        client.call("agent.create", {"name": "a", "provider": "paced", "model": "5000ms"})
    outcome: dict[str, Any] = {}
    worker = _send_in_thread(root, "a", "too slow", outcome)
    _wait_for(lambda: _busy(root), 10)
    assert daemon.terminate(timeout_s=30) == 0
    worker.join(30)
    assert outcome == {"code": protocol.SHUTTING_DOWN}
    start(root)
    with Client(root) as client:
        assert client.call("agent.history", {"agent": "a"})["turns"] == []
        status = client.call("daemon.status")
        assert status["previous_shutdown"] == "clean"
        assert client.call("agent.show", {"agent": "a"})["lost_turn"] is None  # failed, not lost


def test_a_lost_turn_is_reported_once(start: Start, tmp_path: Path) -> None:
    root = tmp_path / "root"
    daemon = start(root)
    with Client(root) as client:
        client.call("agent.create", {"name": "a", "provider": "paced", "model": "1000ms"})
    outcome: dict[str, Any] = {}
    worker = _send_in_thread(root, "a", "doomed", outcome)
    _wait_for(lambda: _busy(root), 10)
    daemon.kill()
    worker.join(30)
    start(root).terminate()  # recovers and reports the lost turn, then stops cleanly
    start(root)
    with Client(root) as client:
        assert client.call("daemon.status")["last_recovery"] is None


@pytest.mark.skipif(
    sys.version_info < (3, 12), reason="only Python 3.12+ warns at a fork with threads running"
)
def test_acting_as_another_uid_forks_without_a_warning(tmp_path: Path) -> None:
    """Under PYTHONWARNINGS=error, 3.12's DeprecationWarning at this fork failed the test."""
    waiting = threading.Event()
    other = threading.Thread(target=waiting.wait, args=(30,))  # a thread runs, as under xdist
    other.start()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            result = _connect_as(os.getuid(), tmp_path / "nothing.sock")
    finally:
        waiting.set()
        other.join()
    assert result == {"connect_error": errno.ENOENT}
