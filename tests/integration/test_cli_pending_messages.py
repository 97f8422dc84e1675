"""A message still waiting for the user after a CLEAN stop is not "redelivered".

Every start puts the pending messages back into their inboxes; only after a crash
is that a redelivery worth a report (the outside review of session 17 found a clean
restart reporting "messages redelivered: 1" like a crash's recovery).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cli import SUBSTRAT, as_json, cli_root, kill_daemon, run

pytestmark = pytest.mark.skipif(not SUBSTRAT, reason="needs the substrat console script")


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    yield from cli_root(tmp_path)


def message_for_the_user(root: Path) -> str:
    assert run(root, "agent", "create", "lead").returncode == 0
    sent = run(root, "agent", "send", "lead", "done\n@send user the report is ready")
    assert sent.returncode == 0, sent.stderr
    (message,) = as_json(run(root, "inbox", "--json"))["messages"]
    return str(message["message_id"])


def test_a_clean_restart_does_not_report_a_waiting_message_as_redelivered(root: Path) -> None:
    message_id = message_for_the_user(root)
    assert run(root, "daemon", "stop").returncode == 0
    started = run(root, "daemon", "start")
    assert started.returncode == 0, started.stderr
    assert "redelivered" not in started.stdout + started.stderr
    status = as_json(run(root, "daemon", "status", "--json"))
    assert status["previous_shutdown"] == "clean" and status["last_recovery"] is None
    assert [m["message_id"] for m in as_json(run(root, "inbox", "--json"))["messages"]] == [
        message_id
    ]  # still there, once

    assert run(root, "daemon", "stop").returncode == 0
    for args in (["recover"], ["compact"]):  # offline recoveries say the same
        offline = run(root, *args)
        assert offline.returncode == 0, (args, offline.stderr)
        assert "redelivered" not in offline.stdout, args
    recovered = as_json(run(root, "recover", "--json"))
    assert recovered["redelivered"] == [] and recovered["waiting"] == [message_id]


def test_a_crash_still_reports_the_message_redelivered(root: Path) -> None:
    message_id = message_for_the_user(root)
    kill_daemon(root)  # SIGKILL: the message was never collected
    started = run(root, "daemon", "start")
    assert started.returncode == 0, started.stderr
    assert "messages redelivered: 1" in started.stdout
    status = as_json(run(root, "daemon", "status", "--json"))
    assert status["previous_shutdown"] == "unclean"
    assert status["last_recovery"]["report"]["redelivered"] == [message_id]
