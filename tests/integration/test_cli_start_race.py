"""Commands that start the daemon at the same time converge on one daemon (outside review
s19f, finding 1): real CLI processes and daemons.

Every command that needs the daemon starts it when none answers. Each used to spawn its
own; one won the root and the others exited 3 telling the user to stop the daemon the rest
were using. The start lock (substrat.rpc.starting) makes them wait for the first start and
use its daemon; ``daemon restart`` holds it across its stop and start.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from substrat import client as client_mod
from substrat.client import Client, DaemonProcess, ping, start_daemon
from substrat.errors import DaemonStartError
from substrat.rpc import lock
from substrat.rpc.starting import flock_holder
from tests.support.cli import cli_env, cli_root, kill_daemon, run, spawn, wait_busy
from tests.support.holders import compacting

pytestmark = pytest.mark.waits


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    yield from cli_root(tmp_path)


def _finish(procs: list[subprocess.Popen[str]]) -> list[tuple[int, str, str]]:
    outputs = [p.communicate(timeout=120) for p in procs]
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outputs, strict=True)]


def _serving_pid(root: Path) -> int:
    answer = ping(root)
    assert answer is not None, "no daemon answers"
    return int(answer["pid"])


def test_parallel_autostarts_after_a_kill_all_use_one_daemon(root: Path) -> None:
    assert run(root, "agent", "create", "lead").returncode == 0
    kill_daemon(root)
    clients = [spawn(root, "agent", "list", "--json") for _ in range(8)]
    results = _finish(clients)
    for code, out, err in results:
        assert code == 0, err
        assert [a["path"] for a in json.loads(out)] == ["lead"]
        assert "in use by" not in err
    started = [err for _code, _out, err in results if "started the daemon" in err]
    assert len(started) <= 1  # --json is quiet about it; a human run says it once
    log = (root / "daemon.log").read_text()
    assert "is in use by" not in log  # no second daemon was spawned and refused


def test_parallel_daemon_starts_report_the_running_one(root: Path) -> None:
    assert run(root, "daemon", "start").returncode == 0
    assert run(root, "daemon", "stop").returncode == 0
    starts = [spawn(root, "daemon", "start", "--json") for _ in range(3)]
    results = _finish(starts)
    for code, _out, err in results:
        assert code == 0, err
    answers = [json.loads(out) for _code, out, _err in results]
    assert sorted(a["started"] for a in answers) == [False, False, True]
    assert {a["pid"] for a in answers} == {_serving_pid(root)}


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(): v.decode(errors="replace") for k, v in pairs}


def _poll(condition: object, what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_restart_runs_its_own_daemon_while_commands_autostart(root: Path) -> None:
    """Commands that find no daemon between a restart's stop and its start wait for its
    daemon, which has the restarting shell's environment (docs/daemon.md)."""
    assert run(root, "daemon", "start").returncode == 0
    created = run(root, "agent", "create", "slow", "--provider", "paced", "--model", "2500ms")
    assert created.returncode == 0, created.stderr
    sender = spawn(root, "agent", "send", "slow", "hi")
    wait_busy(root)  # the stop below waits for this turn: the restart is held in its stop
    restart = spawn(root, "daemon", "restart", "--json", env=cli_env(root, S19G_MARK="restart"))
    with Client(root) as client:
        _poll(lambda: client.call("daemon.status")["stopping"], "the restart did not stop it")
    os.kill(restart.pid, signal.SIGSTOP)
    try:
        _poll(lambda: not lock.is_held(root), "the old daemon did not exit")
        clients = [spawn(root, "agent", "list", "--json") for _ in range(4)]
        # The old code let these start their own daemon now; give them the chance (the
        # new code keeps them waiting for the restart, so this runs out there).
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and all(c.poll() is None for c in clients):
            time.sleep(0.05)
    finally:
        os.kill(restart.pid, signal.SIGCONT)
    code, out, err = _finish([restart])[0]
    assert code == 0, err
    answer = json.loads(out)
    assert answer["started"] is True
    pid = _serving_pid(root)
    assert answer["pid"] == pid
    assert _environ(pid).get("S19G_MARK") == "restart"
    for code, out, err in _finish(clients):
        assert code == 0, err
        assert [a["path"] for a in json.loads(out)] == ["slow"]
    _finish([sender])


def test_a_start_on_a_root_being_compacted_names_the_compaction(root: Path, tmp_path: Path) -> None:
    """An offline `substrat compact` holds the root: a start says so and when to retry, not
    `substrat daemon stop` (no daemon runs)."""
    assert run(root, "daemon", "start").returncode == 0
    assert run(root, "daemon", "stop").returncode == 0
    with compacting(root, tmp_path) as holder:
        with pytest.raises(DaemonStartError) as caught:
            start_daemon(root, timeout_s=0.5)
        assert str(caught.value) == (
            f"the root {root} is being compacted by pid {holder.pid} (substrat compact); "
            "retry when it ends"
        )
        assert ping(root) is None
        alone = subprocess.run(  # the daemon itself, as `daemon start --foreground` runs it
            [sys.executable, "-m", "substrat.daemon", "--root", str(root)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert alone.returncode == 3
        assert str(caught.value) in alone.stderr and "daemon stop" not in alone.stderr
        # a command that starts the daemon waits for the compaction, then serves
        waiting = spawn(root, "agent", "list", "--json")
        log = root / "daemon.log"  # its start lock: held while it waits for the root
        _poll(lambda: flock_holder(log) == waiting.pid, "the command did not wait")
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)
        code, out, err = _finish([waiting])[0]
        assert code == 0, err
        assert json.loads(out) == []


def test_a_start_that_loses_the_root_uses_the_winner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A daemon started without the start lock (``python -m substrat.daemon``) takes the
    root between a start's last look and its spawn: that start's own daemon exits 3 and
    the start reports the winner instead of failing with the loser's log."""
    root = tmp_path / "root"
    with DaemonProcess(root) as winner:
        real_ping, real_is_held = client_mod.ping, lock.is_held
        looks = {"ping": 0, "is_held": 0}

        def late_ping(where: Path, timeout_s: float = 2.0) -> dict[str, Any] | None:
            looks["ping"] += 1  # the start's two looks miss the winner, as in the race
            return None if looks["ping"] <= 2 else real_ping(where, timeout_s)

        def late_is_held(where: Path) -> bool:
            looks["is_held"] += 1
            return False if looks["is_held"] == 1 else real_is_held(where)

        monkeypatch.setattr(client_mod, "ping", late_ping)
        monkeypatch.setattr(lock, "is_held", late_is_held)
        assert start_daemon(root, timeout_s=30) == (winner.pid, False)
        log = (root / "daemon.log").read_text()
        assert log.count("is in use by daemon pid") == 1  # the loser's, which it used
