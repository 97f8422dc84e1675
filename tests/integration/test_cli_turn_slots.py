"""The daemon's turn limit and session slots from the CLI (outside review s19f, findings 3
and 4): ``daemon start``/``restart`` take ``--max-turns`` and ``--slots``, and
``agent send --wait`` waits for a free turn as it waits for a busy agent."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from substrat.cli import daemon_cmds
from substrat.cli.turns import describe_status
from substrat.daemon import DEFAULT_SLOTS
from substrat.multiplexer import MAX_SLOTS
from substrat.rpc.server import Limits
from tests.support.cli import cli_root, run, spawn, wait_busy

pytestmark = pytest.mark.waits


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    yield from cli_root(tmp_path)


def test_the_cli_states_the_daemons_own_defaults_and_ranges() -> None:
    assert Limits().max_concurrent_turns == daemon_cmds.DEFAULT_MAX_TURNS
    assert daemon_cmds.DEFAULT_SLOTS == DEFAULT_SLOTS
    assert daemon_cmds.MAX_SLOTS == MAX_SLOTS


def _daemon_argv(root: Path) -> list[str]:
    status = json.loads(run(root, "daemon", "status", "--json").stdout)
    raw = Path(f"/proc/{status['pid']}/cmdline").read_bytes()
    return [a.decode() for a in raw.split(b"\0") if a]


def test_start_and_restart_take_max_turns_and_slots(root: Path) -> None:
    for command in ("start", "restart"):
        helped = " ".join(run(root, "daemon", command, "--help").stdout.split())
        assert "--max-turns" in helped and "1-4096 (default 8)" in helped
        assert "--slots" in helped and "1-4096 (default 8)" in helped
    assert (
        "live provider sessions"
        in subprocess.run(
            ["python", "-m", "substrat.daemon", "--help"], capture_output=True, text=True
        ).stdout
    )
    assert run(root, "daemon", "start", "--max-turns", "0").returncode == 2
    started = run(root, "daemon", "start", "--max-turns", "3", "--slots", "2")
    assert started.returncode == 0, started.stderr
    status = json.loads(run(root, "daemon", "status", "--json").stdout)
    assert status["limits"]["max_concurrent_turns"] == 3
    argv = _daemon_argv(root)
    assert argv[argv.index("--slots") + 1] == "2"
    restarted = run(root, "daemon", "restart", "--max-turns", "5")
    assert restarted.returncode == 0, restarted.stderr
    status = json.loads(run(root, "daemon", "status", "--json").stdout)
    assert status["limits"]["max_concurrent_turns"] == 5
    assert "--slots" not in _daemon_argv(root)  # the daemon's default again


def test_send_wait_waits_for_a_free_turn_under_the_limit(root: Path) -> None:
    assert run(root, "daemon", "start", "--max-turns", "1").returncode == 0
    # first's turn lasts long enough for the refused send's CLI process to start and reach
    # the daemon on a loaded machine (at 1.5 s it ended first at a load of 15)
    for name, pace in (("first", "8000ms"), ("second", "1500ms")):
        made = run(root, "agent", "create", name, "--provider", "paced", "--model", pace)
        assert made.returncode == 0, made.stderr
    running = spawn(root, "agent", "send", "first", "one")
    wait_busy(root)  # the one turn the limit allows runs now
    refused = run(root, "agent", "send", "second", "two")
    assert refused.returncode == 1
    assert "1 turns are running, the limit is 1; retry when one finishes" in refused.stderr
    waited = run(root, "agent", "send", "second", "two", "--wait")
    assert waited.returncode == 0, waited.stderr
    # a terminal's spinner says why it waits (the daemon's turn.status "queued")
    assert describe_status("second", {"status": "queued", "limit": 1}) == (
        "the daemon runs 1 turns at once, its limit; waiting for one to finish (--wait)"
    )
    _out, err = running.communicate(timeout=60)
    assert running.returncode == 0, err
    history = json.loads(run(root, "log", "second", "--json").stdout)
    assert [t["prompt"] for t in history["turns"]] == ["two"]
