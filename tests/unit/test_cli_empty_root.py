"""An empty --root is refused, not taken for the current directory.

``substrat --root "$DIR" daemon start`` with DIR unset passes ``--root ""``. A plain
path type reads "" as ".", so the command used the shell's current directory: an
empty private one became a root with a daemon in it, and any other one was named as
"not a substrat root" with no word about the empty option. Every --root (a command's,
a group's, ``demo``'s) now stops at parsing, exit 2, saying the path is empty, before
anything is read or written.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from substrat.cli import main

CASES = [
    ["agent", "create", "lead", "--no-autostart", "--root", ""],
    ["--root", "", "agent", "list", "--no-autostart"],
    ["agent", "--root", "", "list", "--no-autostart"],
    ["fsck", "--root", ""],
    ["demo", "--root", ""],
    ["daemon", "start", "--root="],
]


@pytest.mark.parametrize("args", CASES, ids=[" ".join(case) for case in CASES])
def test_an_empty_root_is_a_usage_error_and_the_current_directory_is_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    here = tmp_path / "cwd"
    here.mkdir(mode=0o700)  # what a daemon start would have adopted as a root
    monkeypatch.chdir(here)
    monkeypatch.delenv("SUBSTRAT_HOME", raising=False)
    result = CliRunner().invoke(main, args, prog_name="substrat")
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--root': the path is empty" in result.output
    assert "leave --root out" in result.output
    assert os.listdir(here) == []


def test_an_empty_substrat_home_is_still_the_default_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unchanged: SUBSTRAT_HOME="" is unset, as the daemon reads it (~/.substrat)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("SUBSTRAT_HOME", "")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["agent", "list", "--no-autostart"], prog_name="substrat")
    assert result.exit_code == 2, result.output
    assert f"no substrat root at {tmp_path / '.substrat'}" in result.output
