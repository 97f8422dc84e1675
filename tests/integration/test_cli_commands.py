"""The ``substrat`` command line, run as a real process against a real daemon."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from substrat.rpc import lock
from substrat.rpc.starting import wait_until
from tests.support.cli import (
    SUBSTRAT,
    as_json,
    cli_root,
    kill_daemon,
    read_json_until,
    run,
    spawn,
    wait_busy,
    wait_subscribed,
)

pytestmark = pytest.mark.skipif(not SUBSTRAT, reason="the substrat console script is not installed")


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    yield from cli_root(tmp_path)


def test_commands_start_the_daemon_on_demand_unless_told_not_to(root: Path) -> None:
    refused = run(root, "agent", "create", "lead", "--no-autostart")
    assert refused.returncode == 3
    assert "no daemon is running" in refused.stderr
    assert not lock.is_held(root) and not root.exists()
    created = run(root, "agent", "create", "lead", "-i", "lead the way")
    assert created.returncode == 0, created.stderr
    assert f"created a new root at {root} and started its daemon" in created.stderr
    assert "created lead" in created.stdout
    assert lock.is_held(root)
    run(root, "daemon", "stop")
    again = run(root, "agent", "create", "scout")
    assert again.returncode == 0, again.stderr
    assert "started the daemon" in again.stderr and "new root" not in again.stderr


def test_daemon_lifecycle_commands(root: Path) -> None:
    nothing = run(root, "daemon", "status")
    assert nothing.returncode == 2 and "no substrat root at" in nothing.stderr
    started = as_json(run(root, "daemon", "start", "--json"))
    assert started["started"] is True and started["status"]["pid"] == started["pid"]
    again = as_json(run(root, "daemon", "start", "--json"))
    assert again == {**again, "started": False, "pid": started["pid"]}
    status = as_json(run(root, "daemon", "status", "--json"))
    assert status["running"] is True and status["pid"] == started["pid"]
    assert run(root, "daemon", "status", "--pid").stdout.strip() == str(started["pid"])
    human = run(root, "daemon", "status")
    assert f"pid {started['pid']}" in human.stdout and "previous shutdown: none" in human.stdout
    restarted = as_json(run(root, "daemon", "restart", "--json"))
    assert restarted["stopped"] == started["pid"] and restarted["pid"] != started["pid"]
    stopped = as_json(run(root, "daemon", "stop", "--json"))
    assert stopped == {"stopped": True, "pid": restarted["pid"], "root": str(root)}
    gone = as_json(run(root, "daemon", "stop", "--json"))
    assert gone["stopped"] is False
    after = run(root, "daemon", "status", "--json")
    assert after.returncode == 3
    assert json.loads(after.stdout)["last_daemon"]["state"] == "stopped"


def test_agent_commands_human_and_json(root: Path) -> None:
    lead = as_json(run(root, "agent", "create", "lead", "--json"))
    sent = run(root, "agent", "send", "lead", "plan\n@spawn kid helper\n@send user hi there")
    assert sent.returncode == 0, sent.stderr
    assert sent.stdout.startswith("#1 ") and "spawned kid" in sent.stdout
    assert "turn t1 committed" in sent.stderr
    piped = as_json(run(root, "agent", "send", "lead", "-", "--json", stdin="from stdin"))
    assert piped["turn_id"] == "t2" and piped["prompt"] == "from stdin"
    listed = as_json(run(root, "agent", "list", "--json"))
    assert {a["path"] for a in listed} == {"lead", "lead/kid"}
    table = run(root, "agent", "list").stdout
    assert "lead/kid" in table and "PATH" in table
    tree = as_json(run(root, "agent", "tree", "--json"))
    assert tree[0]["agent"]["agent_id"] == lead["agent_id"]
    assert "kid" in run(root, "agent", "tree").stdout
    shown = as_json(run(root, "agent", "show", "lead", "--json"))
    assert shown["turns"] == 2
    assert "turn t2" in run(root, "agent", "show", "lead").stdout
    history = as_json(run(root, "log", "lead", "--json"))
    assert [t["prompt"] for t in history["turns"]][1] == "from stdin"
    whole = run(root, "log", "lead").stdout
    assert "── turn t1 (#1)" in whole and "not shown" not in whole
    last = run(root, "log", "lead", "-n", "1").stdout  # an older turn is left out, and said so
    assert "1 earlier turn not shown (the last 1 of 2; -n N shows more)" in last
    assert "turn t1 (#1)" not in last and last.index("not shown") < last.index("turn t2 (#2)")
    inbox = as_json(run(root, "inbox", "--json"))
    assert [m["payload"] for m in inbox["messages"]] == ["hi there"]
    assert "hi there" in run(root, "inbox").stdout
    collected = as_json(run(root, "inbox", "--collect", "--json"))
    assert collected["acknowledged"] == [inbox["messages"][0]["message_id"]]
    assert as_json(run(root, "inbox", "--json"))["messages"] == []
    refused = run(root, "agent", "rm", "lead")
    assert refused.returncode == 1 and "has 1 live child (lead/kid)" in refused.stderr
    removed = as_json(run(root, "agent", "rm", "lead", "--cascade", "--json"))
    assert removed["terminated"][-1] == lead["agent_id"] and len(removed["terminated"]) == 2
    missing = run(root, "agent", "send", "lead", "hello?", "--json")
    assert missing.returncode == 1
    error = json.loads(missing.stderr)["error"]
    assert error["type"] == "RpcError" and error["code"] == -32013
    assert error["message"].startswith("agent lead was terminated at ")


def test_daemon_dying_mid_request_is_reported(root: Path) -> None:
    run(root, "agent", "create", "slow", "--provider", "paced", "--model", "3000ms")
    pending = spawn(root, "agent", "send", "slow", "take your time")
    wait_busy(root)
    kill_daemon(root)
    _out, err = pending.communicate(timeout=30)
    assert pending.returncode == 3
    assert "died (crashed or was killed)" in err
    assert "may or may not have been applied" in err


def test_timeouts_are_reported_not_hung(root: Path) -> None:
    run(root, "agent", "create", "slow", "--provider", "paced", "--model", "10000ms")
    late = run(root, "agent", "send", "slow", "hurry", "--timeout", "0.3")
    assert late.returncode == 3
    assert "within 0.3s" in late.stderr
    # It gave up while the turn still runs (not by waiting it out): no clock involved,
    # so a loaded machine that is slow to start the CLI does not fail it.
    status = as_json(run(root, "daemon", "status", "--json"))
    assert status["busy_turns"] == 1, status
    kill_daemon(root)  # do not wait for the turn


def test_log_follow_prints_new_turns_and_stops_when_the_agent_goes(root: Path) -> None:
    run(root, "agent", "create", "lead")
    run(root, "agent", "send", "lead", "first")
    follower = spawn(root, "log", "lead", "--follow", "--json")
    # It subscribes before it prints the history: once "first" is out, nothing is missed.
    read_json_until(follower, lambda e: e.get("prompt") == "first")
    run(root, "agent", "send", "lead", "second")
    run(root, "agent", "rm", "lead")
    out, err = follower.communicate(timeout=30)
    assert follower.returncode == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    assert [(e["event"], e["prompt"]) for e in events] == [("turn", "second")]


def test_watch_reconnects_across_a_crash_and_shows_the_recovery(root: Path) -> None:
    run(root, "daemon", "start", "--heartbeat-s", "0.2")
    run(root, "agent", "create", "lead")
    watcher = spawn(root, "watch", "--json", "--heartbeats", "-e", "turn.completed")
    try:
        read_json_until(watcher, lambda e: e["event"] == "daemon.heartbeat")  # subscribed
        run(root, "agent", "send", "lead", "before the crash")
        seen = read_json_until(watcher, lambda e: e["event"] == "turn.completed")
        kill_daemon(root)
        run(root, "daemon", "start")
        # Events of a daemon nobody watches are not replayed: wait for the reconnection.
        seen += read_json_until(watcher, lambda e: e["event"] == "daemon.recovered")
        run(root, "agent", "send", "lead", "after the crash")
        seen += read_json_until(watcher, lambda e: e["event"] == "turn.completed")
    finally:
        watcher.send_signal(signal.SIGINT)
        watcher.communicate(timeout=30)
    seen = [e for e in seen if e["event"] != "daemon.heartbeat"]
    names = [e["event"] for e in seen]
    # The recovery ran before the new daemon answered: its report comes before
    # connection.restored, and the times never go back.
    assert names == [
        "turn.completed",
        "connection.lost",
        "daemon.recovered",
        "connection.gap",  # no turn ran meanwhile: none is caught up
        "connection.restored",
        "turn.completed",
    ]
    assert seen[0]["params"]["prompt"] == "before the crash"
    lost = seen[1]["params"]["reason"]
    assert "died (crashed or was killed)" in lost and "answering" not in lost, lost
    assert seen[2]["params"]["previous_shutdown"] == "unclean"
    assert seen[3]["params"]["caught_up"] == 0
    assert seen[5]["params"]["prompt"] == "after the crash"
    times = [datetime.fromisoformat(e["params"].get("time") or e["params"]["at"]) for e in seen]
    # (when the watcher noticed the death and when the new daemon started are not ordered)
    assert times[0] <= times[1] and times[2:] == sorted(times[2:]), times


def test_watch_count_exits_and_filters(root: Path) -> None:
    run(root, "agent", "create", "lead")
    watcher = spawn(
        root, "watch", "--json", "--count", "2", "-e", "turn.started", "-e", "turn.completed"
    )
    wait_subscribed(root, 1)
    run(root, "agent", "send", "lead", "hello")
    out, err = watcher.communicate(timeout=30)
    assert watcher.returncode == 0, err
    assert [json.loads(line)["event"] for line in out.splitlines()] == [
        "turn.started",
        "turn.completed",
    ]


def test_fsck_and_recover_exit_codes(root: Path, tmp_path: Path) -> None:
    missing = run(tmp_path / "nowhere", "fsck")
    assert missing.returncode == 2 and "no substrat root at" in missing.stderr
    run(root, "agent", "create", "slow", "--provider", "paced", "--model", "3000ms")
    busy = run(root, "fsck")
    assert busy.returncode == 2 and "substrat daemon stop" in busy.stderr
    pending = spawn(root, "agent", "send", "slow", "doomed turn")
    wait_busy(root)
    kill_daemon(root)
    pending.communicate(timeout=30)
    plan = as_json(run(root, "recover", "--dry-run", "--json"))
    (agent,) = plan["agents"]
    assert agent["name"] == "slow" and agent["lost_turn"]["prompt"] == "doomed turn"
    human_plan = run(root, "recover", "--dry-run")
    assert "LOST IN FLIGHT" in human_plan.stdout and "doomed turn" in human_plan.stdout
    dirty = run(root, "fsck", "--json")
    assert dirty.returncode == 1
    kinds = {f["kind"] for f in json.loads(dirty.stdout)["findings"]}
    assert {"stale_socket", "stale_pending", "unclean_shutdown"} <= kinds
    fixed = run(root, "fsck", "--repair")
    assert fixed.returncode == 1 and "repaired" in fixed.stdout
    # what the repair did, not what the next start would have done
    assert "this repair recovered it" in fixed.stdout, fixed.stdout
    assert "recovers at the next start" not in fixed.stdout, fixed.stdout
    # the agent by its path, as a start and `recover` name it (it was its id, c8e0c3f7)
    assert "lost in flight: slow turn t1 (prompt: doomed turn)" in fixed.stdout, fixed.stdout
    clean = run(root, "fsck")
    assert clean.returncode == 0 and "clean" in clean.stdout
    recovered = as_json(run(root, "recover", "--json"))
    assert recovered["agents"] == 1


def test_recover_names_the_agent_that_lost_a_turn_as_a_start_does(root: Path) -> None:
    # `recover` printed the agent's id (7eaaa135) where `daemon start` prints its name.
    run(root, "agent", "create", "slow", "--provider", "paced", "--model", "3000ms")
    pending = spawn(root, "agent", "send", "slow", "doomed turn")
    wait_busy(root)
    kill_daemon(root)
    pending.communicate(timeout=30)
    recovered = run(root, "recover")
    assert recovered.returncode == 0, recovered.stderr
    assert "lost in flight: slow turn t1 (prompt: doomed turn)" in recovered.stdout, (
        recovered.stdout
    )


def test_second_foreground_daemon_is_refused(root: Path) -> None:
    first = as_json(run(root, "daemon", "start", "--json"))
    second = run(root, "daemon", "start", "--foreground")
    assert second.returncode == 3
    # named as the daemon that serves (the start lock: test_cli_foreground_start)
    said = " ".join(second.stderr.split())
    assert f"a daemon already serves {root} (pid {first['pid']})" in said, said


def test_bad_usage_exits_2(root: Path) -> None:
    assert run(root, "agent", "send").returncode == 2
    assert run(root, "watch", "-e", "no.such.event").returncode == 2


def test_usage_errors_are_json_with_json(root: Path) -> None:
    # click reports them before any command runs: they came as plain text.
    for args in (
        ("agent", "create", "x", "--provider", "nosuch", "--json"),
        ("--json", "agent", "list", "--bogus"),
    ):
        bad = run(root, *args)
        assert bad.returncode == 2, bad.stderr
        error = json.loads(bad.stderr)["error"]
        assert error["type"] in ("BadParameter", "NoSuchOption") and error["message"], error
    plain = run(root, "agent", "create", "x", "--provider", "nosuch")
    assert plain.returncode == 2 and plain.stderr.startswith("Usage:"), plain.stderr
    assert not (root / "agents").exists()  # refused before anything was made


def test_log_follow_after_a_crash_prints_only_what_completed_meanwhile(root: Path) -> None:
    run(root, "daemon", "start", "--heartbeat-s", "0.2")
    run(root, "agent", "create", "lead")
    for prompt in ("one", "two", "three"):
        run(root, "agent", "send", "lead", prompt)
    follower = spawn(root, "log", "lead", "--follow", "--json", "-n", "1")
    try:
        seen = read_json_until(follower, lambda e: e.get("prompt") == "three")
        kill_daemon(root)
        run(root, "daemon", "start")
        run(root, "agent", "send", "lead", "four")
        seen += read_json_until(follower, lambda e: e.get("prompt") == "four")
        if not any(e["event"] == "connection.restored" for e in seen):
            # "four" may be caught up from the history before the restart's lines come
            seen += read_json_until(follower, lambda e: e["event"] == "connection.restored")
    finally:
        follower.send_signal(signal.SIGINT)
        follower.communicate(timeout=30)
    # "one" and "two" were left out by -n 1; the reconnection does not print them.
    turns = [(e["prompt"], e["number"]) for e in seen if e["event"] == "turn"]
    assert turns == [("three", 3), ("four", 4)]
    shown = [e["event"] for e in seen if e["event"] != "turn"]
    assert shown == ["connection.lost", "daemon.recovered", "connection.restored"], seen


def test_stop_after_a_root_moved_under_its_daemon_finds_it_gone(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A root moved under a running daemon: the daemon stops by itself, without a clean
    # shutdown (substrat/rootguard.py; it used to try one on the old paths, fail, and
    # `daemon stop` said "daemon stopped", rc 0). Its guard looks every second, so the
    # test waits for it rather than racing it. The one test of a root moved under a
    # daemon that keeps the default interval (test_root_moved.py sets SUBSTRAT_ROOT_CHECK_S).
    monkeypatch.delenv("SUBSTRAT_ROOT_CHECK_S", raising=False)
    assert run(root, "agent", "create", "lead").returncode == 0
    moved = tmp_path / "moved"
    root.rename(moved)
    assert wait_until(lambda: not lock.is_held(moved), 30.0), "the daemon kept the moved root"
    info = lock.read_info(moved)
    assert info is not None and info.state == "running"  # it never wrote a clean stop
    stopped = run(moved, "daemon", "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert "no daemon running" in stopped.stdout
    assert "no longer exists" in (moved / "daemon.log").read_text()
    started = run(moved, "daemon", "start")  # the next start recovers, the agent is whole
    assert started.returncode == 0, started.stderr
    assert [a["name"] for a in as_json(run(moved, "agent", "list", "--json"))] == ["lead"]
    assert run(moved, "daemon", "stop").returncode == 0
