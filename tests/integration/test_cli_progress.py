"""Progress and liveness from the command line (issue 14, item 5).

A spinner with the retry count on a terminal (a real pseudo-terminal here),
plain retry lines off one; ``watch`` with tool calls and timestamps; a clean
``daemon stop`` ends ``watch``; an offline repair leaves nothing for the next
start to call unclean.
"""

from __future__ import annotations

import os
import re
import select
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.chat_server import ChatServer, error, text
from tests.support.cli import (
    SUBSTRAT,
    as_json,
    cli_env,
    cli_root,
    kill_daemon,
    read_json_until,
    run,
    spawn,
    wait_busy,
    wait_subscribed,
)

pytestmark = [
    pytest.mark.waits,
    pytest.mark.skipif(not SUBSTRAT, reason="the substrat console script is not installed"),
]
CLOCK = re.compile(r"^\d\d:\d\d:\d\d ")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?\+00:00$")


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    yield from cli_root(tmp_path)


def openai_env(root: Path, server: ChatServer) -> dict[str, str]:
    return cli_env(
        root,
        SUBSTRAT_OPENAI_BASE_URL=server.base_url,
        SUBSTRAT_OPENAI_API_KEY="loopback",
        TERM="xterm-256color",
    )


def run_on_a_terminal(argv: list[str], env: dict[str, str], timeout_s: float = 60) -> str:
    """Run with stderr on a pseudo-terminal (stdout a pipe); what the terminal showed."""
    master, slave = os.openpty()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=slave, env=env)
    os.close(slave)
    shown = bytearray()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the terminal closed with the process
                break
            if not chunk:
                break
            shown += chunk
        elif proc.poll() is not None:
            break
    os.close(master)
    proc.communicate(timeout=10)
    return shown.decode("utf-8", "replace")


def plain(screen: str) -> str:
    """What the terminal showed, without its control sequences."""
    return ANSI.sub("", screen)


def test_a_spinner_counts_the_retries_on_a_terminal_and_lines_say_so_off_one(
    root: Path,
) -> None:
    with ChatServer() as server:
        env = openai_env(root, server)
        run(root, "daemon", "start", env=env)
        run(root, "agent", "create", "bot", "--provider", "openai", "--model", "m", env=env)
        down = error(503, "the endpoint is down", "unavailable")
        server.script(down, down, text("finally"))
        screen = plain(run_on_a_terminal([SUBSTRAT, "agent", "send", "bot", "hello?"], env))
        assert "retrying (1/5)" in screen and "retrying (2/5)" in screen, screen
        assert "HTTP 503" in screen
        assert "✓ turn t1 committed" in screen
        server.script(down, text("again"))
        piped = run(root, "agent", "send", "bot", "once more", env=env)
        assert piped.returncode == 0, piped.stderr
        assert piped.stdout == "again\n"
        lines = piped.stderr.splitlines()
        assert lines[0].startswith("↻ retrying (1/5) in ") and "HTTP 503" in lines[0], lines
        assert lines[-1] == "✓ turn t2 committed"
        assert "\x1b" not in piped.stderr  # no spinner, no colour off a terminal
        # NO_COLOR: the spinner stays (it is not colour), the colours go.
        server.script(down, text("plain"))
        screen = run_on_a_terminal(
            [SUBSTRAT, "agent", "send", "bot", "no colour"], {**env, "NO_COLOR": "1"}
        )
        assert "retrying (1/5)" in plain(screen) and "✓ turn t3 committed" in plain(screen)
        assert not re.search(r"\x1b\[[0-9;]*3[0-9]m", screen), screen


def test_watch_shows_tool_calls_with_timestamps_in_text_and_json(root: Path) -> None:
    run(root, "agent", "create", "lead")
    people = spawn(root, "watch", "-e", "turn.tool", "-e", "turn.completed")
    machines = spawn(root, "watch", "--json")
    wait_subscribed(root, 2)
    run(root, "agent", "send", "lead", "go\n@spawn scout map it\n@send scout map the river")
    events = read_json_until(machines, lambda e: e["event"] == "turn.completed")
    tools = [e["params"] for e in events if e["event"] == "turn.tool"]
    assert [t["tool"] for t in tools] == ["spawn_agent", "send_message"]
    assert tools[1]["arguments"] == {"recipient": "scout", "text": "map the river"}
    assert tools[1]["result"].endswith(" to lead/scout")
    assert all(ISO_UTC.match(e["params"]["time"]) for e in events), events
    assert people.stdout is not None
    lines = [people.stdout.readline().rstrip("\n") for _ in range(3)]
    for proc in (people, machines):
        proc.terminate()
        proc.communicate(timeout=30)
    assert all(CLOCK.match(line) for line in lines), lines
    assert (
        "turn.tool" in lines[1] and "send_message(recipient=scout, text=map the river)" in lines[1]
    )
    assert lines[1].endswith("→ sent message " + tools[1]["result"].split()[2] + " to lead/scout")
    assert "turn.completed" in lines[2]


def test_a_clean_stop_ends_watch_unless_it_follows_restarts(root: Path) -> None:
    run(root, "daemon", "start")
    plain = spawn(root, "watch")
    follower = spawn(root, "watch", "--json", "--follow-restarts")
    try:
        wait_subscribed(root, 2)
        assert run(root, "daemon", "stop").returncode == 0
        out, err = plain.communicate(timeout=30)
        assert plain.returncode == 0, err
        assert "daemon.stopping" in out and "watch ends with it" in out
        assert "waiting for the daemon" not in out
        # with its time, as every other event's line (it had "--:--:--")
        (stopping,) = [line for line in out.splitlines() if "daemon.stopping" in line]
        assert CLOCK.match(stopping), stopping
        assert follower.poll() is None  # still there, waiting for a daemon
        run(root, "daemon", "start")
        seen = read_json_until(follower, lambda e: e["event"] == "connection.restored")
        (farewell,) = [e["params"] for e in seen if e["event"] == "daemon.stopping"]
        assert ISO_UTC.match(farewell["time"]) and farewell["reason"], farewell
    finally:  # a failed assertion must not leave a watcher waiting for daemons forever
        follower.terminate()
        follower.communicate(timeout=30)


@pytest.mark.parametrize("follow_restarts", [False, True])
def test_a_clean_stop_between_subscribing_and_the_catch_up_is_a_clean_stop(
    root: Path, follow_restarts: bool
) -> None:
    """watch subscribes, then asks the daemon for the agents' names; a daemon that stopped
    cleanly in between made that call fail and watch exit 3 ("shut down before answering
    agent.list"). Now the stream shows the daemon's stopping notice and ends, or, following
    restarts, waits for the next daemon."""
    from substrat.cli.common import Opts
    from substrat.cli.events_cmds import stream_events
    from substrat.client import Client, stop_daemon

    run(root, "daemon", "start")

    def stop_then_catch_up(conn: Client, reconnected: bool) -> None:
        if not reconnected:
            stop_daemon(root)  # returns once the daemon is gone
            conn.call("agent.list")

    stream = stream_events(
        Opts(root), None, follow_restarts=follow_restarts, on_subscribed=stop_then_catch_up
    )
    try:
        if not follow_restarts:
            assert [name for name, _ in stream] == ["daemon.stopping"]
            return
        assert [next(stream)[0], next(stream)[0]] == ["daemon.stopping", "connection.lost"]
        run(root, "daemon", "start")
        assert next(stream)[0] == "connection.restored"
    finally:
        stream.close()


@pytest.mark.parametrize("offline", [["fsck", "--repair"], ["recover"]])
def test_after_an_offline_recovery_the_next_start_finds_nothing_unclean(
    root: Path, offline: list[str]
) -> None:
    run(root, "agent", "create", "slow", "--provider", "paced", "--model", "3000ms")
    doomed = spawn(root, "agent", "send", "slow", "cut short")
    wait_busy(root)
    kill_daemon(root)
    doomed.communicate(timeout=30)
    done = run(root, *offline)
    assert done.returncode in (0, 1), done.stderr  # fsck --repair says 1: it found damage
    status = run(root, "daemon", "status")
    assert "recovered the root" in status.stdout and "nothing is left to recover" in status.stdout
    started = run(root, "daemon", "start")
    assert started.returncode == 0, started.stderr
    assert "died without shutting down" not in started.stdout
    answer = as_json(run(root, "daemon", "status", "--json"))
    assert answer["previous_shutdown"] == "recovered"
    assert answer["last_recovery"] is None  # nothing left to report
    assert as_json(run(root, "agent", "show", "slow", "--json"))["lost_turn"]["turn_id"] == "t1"
