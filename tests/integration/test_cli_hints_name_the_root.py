"""A command a message tells a ``--root R`` user to run names R.

Run as shown, `` `substrat agent list --all` `` (or `` `substrat fsck --repair` ``, or
`` `substrat daemon restart` ``) acts on the default root: for a user of ``--root R``,
another root. Every such command in the CLI's output and errors (the daemon's messages
too) gets ``--root R`` when R is not the root the command would find by itself; for a
user of the default root (or of ``$SUBSTRAT_HOME``) messages read as before. Real CLI
processes and a real daemon.
"""

from __future__ import annotations

import io
import json
import re
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from substrat.cli.output import Output
from substrat.shellword import rooted, shell_word
from tests.support.cli import SUBSTRAT, cli_env, run, stop_or_kill

needs_cli = pytest.mark.skipif(not SUBSTRAT, reason="needs the substrat console script")


def test_a_command_without_a_root_gets_it_and_others_are_left() -> None:
    message = (
        "no agent x; `substrat agent list --all` shows every agent, "
        "`substrat daemon stop --root /r` stops it, `substrat demo` shows one, "
        "and `kill -9 12` kills it"
    )
    assert rooted(message, "'/my r'") == (
        "no agent x; `substrat agent list --all --root '/my r'` shows every agent, "
        "`substrat daemon stop --root /r` stops it, `substrat demo` shows one, "
        "and `kill -9 12` kills it"
    )
    assert rooted(rooted(message, "/r2"), "/r2") == rooted(message, "/r2")  # once only
    assert rooted("`substrat log\nlead`", "/r") == "`substrat log\nlead`"  # one line only


def test_output_names_the_root_in_commands_and_keeps_markup(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    written = io.StringIO()
    monkeypatch.setattr(sys, "stdout", written)
    Output(root_word="/srv/[r]").print("[yellow]left:[/] a (`substrat fsck --repair` moves it)")
    Output().print("[yellow]left:[/] b (`substrat fsck --repair` moves it)")
    assert written.getvalue().splitlines() == [
        "left: a (`substrat fsck --repair --root /srv/[r]` moves it)",  # not read as markup
        "left: b (`substrat fsck --repair` moves it)",
    ]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "my roots" / "r"  # a blank: the word must be quoted
    created = run(root, "--root", str(root), "agent", "create", "lead", "--provider", "fake")
    assert created.returncode == 0, created.stderr
    yield root
    stop_or_kill(root)


@needs_cli
def test_a_daemons_hint_names_the_root_given_by_option_and_runs_there(
    served: Path, tmp_path: Path
) -> None:
    elsewhere = cli_env(tmp_path / "default")  # $SUBSTRAT_HOME: another root
    failed = run(served, "--root", str(served), "agent", "send", "nosuch", "hi", env=elsewhere)
    assert failed.returncode != 0
    hint = f"`substrat agent list --all --root {shell_word(served)}`"
    assert hint in failed.stderr, failed.stderr
    command = shlex.split(re.search(r"`(substrat [^`]*)`", failed.stderr)[1])  # type: ignore[index]
    listed = run(served, *command[1:], "--json", env=elsewhere)  # as the user would run it
    assert listed.returncode == 0, listed.stderr
    assert [agent["path"] for agent in json.loads(listed.stdout)] == ["lead"]
    assert not (tmp_path / "default").exists()  # the default root was never touched

    as_json = run(
        served, "--root", str(served), "--json", "agent", "send", "nosuch", "hi", env=elsewhere
    )
    assert hint in json.loads(as_json.stderr)["error"]["message"]


@needs_cli
def test_the_default_roots_hints_read_as_before(served: Path) -> None:
    failed = run(served, "agent", "send", "nosuch", "hi")  # its $SUBSTRAT_HOME is the root
    assert "`substrat agent list --all` shows every agent" in failed.stderr, failed.stderr
