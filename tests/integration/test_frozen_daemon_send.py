"""``agent send`` to a daemon that is frozen (SIGSTOP) gives up, as other commands do.

A turn may legitimately be silent for long (``agent send`` allows 600 s), so the
wait itself is not cut short; but a daemon silent for SILENCE_CHECK_S is pinged
on a second connection, and one that does not answer the ping either is given
up on with what to do (exit 3), instead of 600 silent seconds off a terminal.
A daemon that is busy, not frozen, answers the ping and the turn is waited for.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from substrat import client as client_mod
from substrat.cli import common as cli_common
from substrat.cli.common import Opts
from substrat.client import Client
from substrat.errors import RequestTimeoutError
from tests.support import roots, warm


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """A daemon serving ``slow`` (paced); its pid and root. Never left stopped."""
    root = tmp_path / "root"
    made = roots.cli(root, "agent", "create", "slow", "--provider", "paced", "--model", "1ms")
    assert made.returncode == 0, made.stderr
    with Client(root) as conn:
        pid = int(conn.call("ping")["pid"])
    yield pid, root
    os.kill(pid, signal.SIGCONT)
    roots.cli(root, "daemon", "stop")


QUICK_CLI = [
    sys.executable,
    "-c",
    "import sys; from substrat import client; from substrat.cli import common, main; "
    "client.SILENCE_CHECK_S = common.PING_S = 0.2; sys.exit(main())",
]
"""``substrat`` with its silence check and its ping's patience at 0.2 s instead of 20 and 5:
the command's code is the same, and a stopped daemon answers no ping however long one
waits, so the test waited 25 s (a worker's) for nothing it checks."""


def test_a_send_to_a_frozen_daemon_gives_up(daemon: tuple[int, Path]) -> None:
    pid, root = daemon
    os.kill(pid, signal.SIGSTOP)
    try:
        sent = warm.run(
            [*QUICK_CLI, "agent", "send", "slow", "frozen?", "--no-stream", "--root", str(root)],
            capture_output=True,
            text=True,
            timeout=180,  # the old code waited out --timeout (600 s)
        )
    finally:
        os.kill(pid, signal.SIGCONT)
    assert sent.returncode == 3, sent.stdout + sent.stderr
    assert "does not answer a ping" in sent.stderr and "kill -CONT" in sent.stderr, sent.stderr


def test_a_busy_daemon_is_waited_for(
    daemon: tuple[int, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Silent on the turn's connection for many checks, but answering pings: waited for."""
    pid, root = daemon
    monkeypatch.setattr(client_mod, "SILENCE_CHECK_S", 0.2)
    checks: list[float] = []
    frozen = Opts(root).frozen_check()

    def counted(silent_s: float) -> None:
        checks.append(silent_s)
        frozen(silent_s)

    with Client(root, timeout_s=60) as conn:
        result = conn.call(
            "agent.send", {"agent": "slow", "prompt": "@pace 2000ms slow"}, on_silence=counted
        )
    assert result["turn_id"] == "t1"
    assert len(checks) >= 3, checks

    # a stopped daemon answers no ping however long one waits: 0.2 s, not 5 (the busy one
    # above had the default, which it needs under load)
    monkeypatch.setattr(cli_common, "PING_S", 0.2)
    os.kill(pid, signal.SIGSTOP)
    try:
        with Client(root, timeout_s=60) as conn, pytest.raises(RequestTimeoutError) as gave_up:
            conn.call("agent.send", {"agent": "slow", "prompt": "frozen"}, on_silence=frozen)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert f"(pid {pid})" in str(gave_up.value)
