"""A command that reaches a daemon in its stop's grace: real daemon processes.

``daemon stop`` (or SIGTERM) lets the turns a daemon runs finish, for up to its grace;
meanwhile it closes its socket to new connections but refuses new work on the ones it
has (``-32008``). A command that connected just before used to fail with "shutting
down" (exit 1). The refusal now says the request was not applied, so the command waits
for that daemon to exit, starts the next one (as when none runs) and sends the request
there; a request the stop cut short is never sent twice (docs/daemon.md).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from substrat.client import Client, connect_or_start, ping
from substrat.errors import DaemonNotRunningError, RpcError
from substrat.rpc import lock, protocol
from tests.support.cli import SUBSTRAT, cli_root, run, spawn, wait_busy

pytestmark = [
    pytest.mark.waits,
    pytest.mark.skipif(not SUBSTRAT, reason="the substrat console script is not installed"),
]


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    yield from cli_root(tmp_path)


def _poll(condition: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


TURN = "6000ms"
"""The slow turn that keeps the daemon in its stop's grace (10 s) while a command races
the stop: long enough for a loaded machine's few seconds between the steps below."""


def _daemon(root: Path, *start_args: str) -> int:
    """A daemon with an agent ``slow`` whose turns take TURN; its pid."""
    started = run(root, "daemon", "start", *start_args)
    assert started.returncode == 0, started.stderr
    created = run(root, "agent", "create", "slow", "--provider", "paced", "--model", TURN)
    assert created.returncode == 0, created.stderr
    answer = ping(root)
    assert answer is not None
    return int(answer["pid"])


def _slow_turn(root: Path) -> subprocess.Popen[str]:
    """A turn of ``slow`` that runs (the stop waits for it); its sender."""
    sender = spawn(root, "agent", "send", "slow", "take your time")
    wait_busy(root)
    return sender


def _stopping(client: Client) -> Callable[[], bool]:
    return lambda: bool(client.call("daemon.status")["stopping"])


def test_a_request_refused_by_a_stopping_daemon_goes_to_the_next_one(root: Path) -> None:
    old_pid = _daemon(root)
    command = connect_or_start(root, create=False)  # connected before the stop, as in the race
    with command, Client(root) as watcher:
        sender = _slow_turn(root)
        stopper = spawn(root, "daemon", "stop")
        _poll(_stopping(watcher), "the daemon did not start stopping")
        assert ping(root) is None  # no new connection: its socket is closed already
        listed = command.call("agent.list", {"all": False})
        assert [a["path"] for a in listed] == ["slow"]
        new = command.call("ping")
        assert new["pid"] != old_pid and new["stopping"] is False
    out, err = stopper.communicate(timeout=60)
    assert stopper.returncode == 0, err
    assert f"daemon stopped (pid {old_pid})" in out
    out, err = sender.communicate(timeout=60)
    assert sender.returncode == 0, err  # the turn finished within the grace
    history = run(root, "log", "slow", "--json")
    assert history.returncode == 0, history.stderr


def test_chat_sends_a_line_typed_during_the_stop_to_the_next_daemon(root: Path) -> None:
    """A real command (``chat`` holds its connection between lines) races the stop."""
    old_pid = _daemon(root)
    assert run(root, "agent", "create", "lead").returncode == 0
    chat = spawn(root, "chat", "lead", "--json", stdin=subprocess.PIPE)
    assert chat.stdin is not None and chat.stdout is not None
    assert '"event": "chat"' in chat.stdout.readline()  # connected
    with Client(root) as watcher:
        sender = _slow_turn(root)
        os.kill(old_pid, signal.SIGTERM)
        _poll(_stopping(watcher), "the daemon did not start stopping")
        out, err = chat.communicate("hello there\n", timeout=120)
    assert chat.returncode == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    assert [(e["event"], e.get("prompt")) for e in events] == [("turn", "hello there")], out
    new = ping(root)
    assert new is not None and new["pid"] != old_pid
    assert sender.wait(timeout=60) == 0


def test_without_autostart_the_refusal_says_what_to_do(root: Path) -> None:
    old_pid = _daemon(root)
    command = connect_or_start(root, create=False, autostart=False)
    with command, Client(root) as watcher:
        sender = _slow_turn(root)
        os.kill(old_pid, signal.SIGTERM)
        _poll(_stopping(watcher), "the daemon did not start stopping")
        with pytest.raises(DaemonNotRunningError) as caught:
            command.call("agent.list", {"all": False})
    assert str(caught.value) == (
        f"the daemon (pid {old_pid}) for {root} is stopping: it refused agent.list, which "
        f"was not applied; run the command again once a daemon serves (`substrat daemon "
        f"start --root {root}`)"
    )
    assert sender.wait(timeout=60) == 0
    assert ping(root) is None  # nothing started a daemon


def test_a_turn_the_stop_cut_short_is_not_sent_again(root: Path) -> None:
    """Past the grace the stop cancels a running turn: it may have been applied in part,
    so its refusal says nothing of ``applied`` and the client does not resend it."""
    old_pid = _daemon(root, "--grace-s", "0.3")
    command = connect_or_start(root, create=False)
    outcome: dict[str, Any] = {}

    def send() -> None:
        try:
            outcome["result"] = command.call("agent.send", {"agent": "slow", "prompt": "cut"})
        except RpcError as exc:
            outcome["error"] = exc

    worker = threading.Thread(target=send)
    with command:
        worker.start()
        _poll(lambda: _busy_turns(root) >= 1, "the turn did not start")
        os.kill(old_pid, signal.SIGTERM)
        worker.join(60)
    error = outcome.get("error")
    assert isinstance(error, RpcError), outcome
    assert error.code == protocol.SHUTTING_DOWN
    assert not isinstance(error.data, dict) or "applied" not in error.data
    _poll(lambda: not lock.is_held(root), "the old daemon did not exit")
    assert ping(root) is None  # not sent again: no next daemon was started for it


def _busy_turns(root: Path) -> int:
    with Client(root) as client:
        return int(client.call("daemon.status")["busy_turns"])
