"""The few lines a recovery's report becomes (``substrat recover``, ``watch``)."""

from __future__ import annotations

from substrat.cli.lines import event_text, recovery_lines


def test_a_start_that_set_the_checkpoints_aside_says_why() -> None:
    why = "the log of 4f2c is damaged (bad_checksum)"
    lines = recovery_lines({"report": {"agents": 2, "checkpoints_set_aside": why}})
    (line,) = [x for x in lines if "checkpoints set aside" in x]
    assert why in line and "every log read from its start" in line


def test_a_start_that_used_its_checkpoints_says_nothing_of_them() -> None:
    lines = recovery_lines({"report": {"agents": 2, "checkpoints_set_aside": None}})
    assert not [x for x in lines if "checkpoints" in x]


def test_watch_lines_of_the_daemon_and_the_connection_read_like_the_others() -> None:
    """``daemon.stopping`` and the ``connection.*`` markers were ``reason=...`` and
    ``pid=...`` (the dump for unknown events), and ``connection.restored`` pushed its
    body a column right of the others."""
    from rich.text import Text

    at = "2026-11-27T10:57:23+00:00"
    events = [
        ("turn.started", {"agent_id": "a" * 32, "turn_id": "t1", "time": at}),
        ("daemon.stopping", {"reason": "daemon.shutdown request", "time": at}),
        ("connection.lost", {"reason": "the daemon (pid 7) died", "time": at}),
        ("connection.restored", {"pid": 8, "time": at}),
    ]
    lines = [Text.from_markup(event_text(n, p, {"a" * 32: "lead"})).plain for n, p in events]
    bodies = [line.split(name, 1)[1] for line, (name, _) in zip(lines, events, strict=True)]
    assert [b.lstrip() for b in bodies] == [
        "lead t1",
        "daemon.shutdown request",
        "the daemon (pid 7) died",
        "pid 8",
    ], lines
    assert len({line.index(body.lstrip()) for line, body in zip(lines, bodies, strict=True)}) == 1
    assert all("--:--:--" not in line for line in lines)


def test_log_damage_names_a_root_log_whole_and_an_agent_by_its_short_id() -> None:
    sid = "6dcc89b7a43946efb135b0effc8c1b71"
    damage = {"checkpoints": {"torn_tail": 1}, sid: {"bad_checksum": 2}}
    lines = recovery_lines({"report": {"agents": 1, "log_damage": damage}})
    found = [x.split("[/] ", 1)[1] for x in lines if "log damage skipped" in x]
    assert found == ["in checkpoints: torn_tail=1", "in 6dcc89b7: bad_checksum=2"], lines


def test_a_quarantine_line_says_what_moved_and_what_stayed() -> None:
    moved = {"name": "6dcc89b7", "kind": "corrupt", "reason": "bad crc", "moved_to": "/r/q/x"}
    stayed = {"name": "foo", "kind": "bad_name", "reason": "not a session id", "moved_to": None}
    lines = recovery_lines({"report": {"agents": 1, "quarantined": [moved, stayed]}})
    assert "6dcc89b7's record, moved to /r/q/x" in lines[-2], lines
    assert "left in place:[/] agents/foo" in lines[-1] and "fsck --repair" in lines[-1], lines
