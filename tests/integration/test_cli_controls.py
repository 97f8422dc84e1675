"""Control characters in untrusted text (prompts, answers, log lines) are shown, not obeyed.

A model's answer printed raw to a terminal could recolour, hide or rewrite what
the user reads, or set their clipboard (OSC 52): an outsider saw `substrat log`
print a prompt's ESC sequences raw.
"""

from __future__ import annotations

import os
import pty
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from substrat.cli.common import for_terminal, visible
from tests.support import warm
from tests.support.cli import SUBSTRAT, cli_env, cli_root, run

pytestmark = pytest.mark.skipif(not SUBSTRAT, reason="the substrat console script is not installed")

TITLE = "\x1b]0;pwned\x07"  # sets the terminal's window title
RED = "\x1b[31m"


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    yield from cli_root(tmp_path)


def test_visible_shows_controls_and_keeps_layout() -> None:
    assert visible(f"a{RED}b\rc\nd\te\x9b\x7f") == "a\\x1b[31mb\\x0dc\nd\te\\x9b\\x7f"
    assert visible("plain, ünïcode ✓") == "plain, ünïcode ✓"


def test_for_terminal_leaves_a_pipe_raw(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdout.isatty", lambda: False)
    assert for_terminal(RED) == RED  # piped into a file: the model's exact text


def test_log_shows_a_prompts_escape_sequences(root: Path) -> None:
    assert run(root, "agent", "create", "lead").returncode == 0
    assert run(root, "agent", "send", "lead", f"hi {RED}there{TITLE}").returncode == 0
    shown = run(root, "log", "lead")
    assert shown.returncode == 0, shown.stderr
    assert "\x1b" not in shown.stdout and "\x07" not in shown.stdout
    assert "hi \\x1b[31mthere\\x1b]0;pwned\\x07" in shown.stdout


def test_an_answer_on_a_terminal_shows_its_escape_sequences(root: Path) -> None:
    # The scripted provider's answer names the unknown agent it was asked about.
    assert run(root, "agent", "create", "lead").returncode == 0
    main, secondary = pty.openpty()
    try:
        proc = warm.run(
            [SUBSTRAT, "agent", "send", "lead", f"@inspect x{TITLE}"],
            stdin=subprocess.DEVNULL,
            stdout=secondary,
            stderr=subprocess.PIPE,
            env=cli_env(root),
            timeout=60,
        )
        os.close(secondary)
        chunks = []
        while True:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # EIO: the terminal's other end is closed and drained
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(main)
    out = b"".join(chunks).decode()
    assert proc.returncode == 0, proc.stderr
    assert "x\\x1b]0;pwned\\x07" in out, out
    assert TITLE not in out
