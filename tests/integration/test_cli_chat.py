"""``substrat chat``: a conversation that survives the daemon (issue 14's REPL).

The chat runs as a real process fed through a pipe, as a script would feed it
(on a terminal it reads the same lines with line editing).
"""

from __future__ import annotations

import os
import queue
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from tests.support.cli import SUBSTRAT, as_json, cli_root, kill_daemon, run, spawn, wait_busy

pytestmark = pytest.mark.skipif(not SUBSTRAT, reason="the substrat console script is not installed")


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    yield from cli_root(tmp_path)


class Lines:
    """A stream read line by line in the background, so a test can wait for a line."""

    def __init__(self, stream: IO[str]) -> None:
        self.seen: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream: IO[str]) -> None:
        # closed at its end: an unclosed pipe is a ResourceWarning (PYTHONWARNINGS=error)
        with stream:
            for line in stream:
                self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def expect(self, text: str, timeout_s: float = 60) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self._queue.get(timeout=0.1)
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError(f"stream ended before {text!r}; saw {self.seen}")
            self.seen.append(line)
            if text in line:
                return line
        raise AssertionError(f"no {text!r} within {timeout_s}s; saw {self.seen}")


def test_lines_closes_its_stream_at_the_end() -> None:
    """An unclosed pipe is a ResourceWarning: under PYTHONWARNINGS=error the chat tests failed."""
    read_end, write_end = os.pipe()
    stream = os.fdopen(read_end, encoding="utf-8")
    lines = Lines(stream)
    os.write(write_end, b"only line\n")
    os.close(write_end)
    assert lines.expect("only line") == "only line"
    deadline = time.monotonic() + 30
    while not stream.closed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stream.closed


def start_chat(root: Path, *args: str) -> tuple[subprocess.Popen[str], Lines, Lines]:
    proc = spawn(root, "chat", *args, stdin=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    return proc, Lines(proc.stdout), Lines(proc.stderr)


def say(proc: subprocess.Popen[str], line: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(line + "\n")
    proc.stdin.flush()


def test_chat_sends_each_line_and_confirms_each_commit(root: Path) -> None:
    run(root, "agent", "create", "lead")
    chat, out, err = start_chat(root, "lead")
    err.expect("lead (scripted/directives, 0 turns)")
    say(chat, "hello there")
    out.expect("#1 scripted reply; digest of the conversation so far: ")
    err.expect("✓ turn t1 committed")
    say(chat, "")  # a blank line is no turn
    say(chat, "two lines, \\")
    say(chat, "@spawn scout look around")
    out.expect("spawn_agent: spawned scout")
    err.expect("✓ turn t2 committed · spawned scout")
    say(chat, "/log 1")
    out.expect("── turn t2 (#2)")
    say(chat, "/quit")
    assert chat.wait(30) == 0
    assert chat.stdin is not None
    chat.stdin.close()  # unclosed, a ResourceWarning (PYTHONWARNINGS=error)
    turns = as_json(run(root, "log", "lead", "--json"))["turns"]
    assert [t["prompt"] for t in turns] == ["hello there", "two lines, \n@spawn scout look around"]


def test_chat_survives_a_sigkill_mid_turn_and_reports_the_lost_turn(root: Path) -> None:
    # Only the turn the kill cuts is slow; the others take the agent's own pace (20 ms).
    run(root, "agent", "create", "slow", "--provider", "paced")
    chat, _out, err = start_chat(root, "slow")
    say(chat, "first")
    err.expect("✓ turn t1 committed")
    say(chat, "@pace 5000ms this one is cut")
    wait_busy(root)
    kill_daemon(root)
    err.expect("? outcome unknown: the daemon died before confirming turn t2")
    err.expect("reconnected to the daemon")  # chat started it again; recovery ran first
    err.expect("turn t2 was lost in the crash (prompt: @pace 5000ms this one is cut); slow is")
    say(chat, "where were we?")
    err.expect("✓ turn t3 committed")
    assert chat.stdin is not None
    chat.stdin.close()  # Ctrl-D
    assert chat.wait(30) == 0
    assert not any("committed after all" in line for line in err.seen)
    turns = as_json(run(root, "log", "slow", "--json"))["turns"]
    assert [t["turn_id"] for t in turns] == ["t1", "t3"]
    assert "was lost in flight" in turns[1]["prompt"]  # the agent was told
    assert turns[1]["prompt"].endswith("where were we?")


def test_chat_with_json_prints_one_object_per_event(root: Path) -> None:
    run(root, "agent", "create", "lead")
    done = run(root, "chat", "lead", "--json", stdin="hi\n/show\n")
    assert done.returncode == 0, done.stderr
    events = [line.split('"event": "')[1].split('"')[0] for line in done.stdout.splitlines()]
    assert events == ["chat", "turn", "show"]
    gone = run(root, "chat", "nobody")
    assert gone.returncode == 1 and "no agent nobody" in gone.stderr
