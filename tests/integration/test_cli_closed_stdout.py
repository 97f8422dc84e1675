"""A closed standard output (``substrat agent list -q | head -1``) is not a daemon failure
(outside review s19f, finding 5): every command stops quietly with 141, as a program
killed by SIGPIPE does, instead of exit 3 "talking to the daemon failed: Broken pipe" or
a silent exit 1."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import warm
from tests.support.cli import SUBSTRAT, cli_env, cli_root, run


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    yield from cli_root(tmp_path)


def _with_closed_stdout(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run with stdout a pipe whose reader is gone before the command writes (``head``
    after its line: deterministic, where ``| head -1`` races the first write)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return warm.run(
            [SUBSTRAT, *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            env=cli_env(root),
        )
    finally:
        os.close(write_end)


COMMANDS = [
    ("agent", "list", "-q"),
    ("agent", "list"),
    ("--json", "agent", "list"),
    ("agent", "tree"),
    ("agent", "show", "lead"),
    ("daemon", "status"),
    ("watch", "--heartbeats"),
    ("--json", "watch", "--heartbeats"),
    ("log", "lead"),
]


def test_a_closed_stdout_exits_141_quietly(root: Path) -> None:
    assert run(root, "daemon", "start", "--heartbeat-s", "0.2").returncode == 0
    assert run(root, "agent", "create", "lead").returncode == 0
    assert run(root, "agent", "send", "lead", "hello").returncode == 0
    outcomes = {args: _with_closed_stdout(root, *args) for args in COMMANDS}
    assert {a: (d.returncode, d.stderr) for a, d in outcomes.items()} == {
        a: (141, "") for a in COMMANDS
    }
    assert run(root, "daemon", "status").returncode == 0  # the daemon is fine


def _with_stdout_closed_at_start(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", "-c", 'exec "$@" >&-', "sh", SUBSTRAT, *args],
        stderr=subprocess.PIPE,
        text=True,
        timeout=60,
        env=cli_env(root),
    )


def test_a_stdout_closed_from_the_start_takes_nothing_and_fails_nothing(root: Path) -> None:
    # `substrat agent send lead hi >&-`: Python starts with sys.stdout None; the turn is
    # sent and committed as with any other output (click and rich write nowhere), where
    # the streamed text's terminal check failed with a traceback (exit 1).
    assert run(root, "agent", "create", "lead").returncode == 0
    sent = _with_stdout_closed_at_start(root, "agent", "send", "lead", "hello")
    assert sent.returncode == 0 and "turn t1 committed" in sent.stderr, sent.stderr
    shown = _with_stdout_closed_at_start(root, "agent", "show", "lead")
    assert (shown.returncode, shown.stderr) == (0, "")
