"""The commands a message tells a user to run quote the root's path.

An outsider's root under a directory with a space (SUBSTRAT_HOME="rel home/r") got
"`substrat daemon start --root /rel home/r` ... creates one": copied into a shell,
that names /rel, with a stray argument. Every such command now quotes its paths as
the shell reads them back (:func:`substrat.shellword.shell_word`).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

import substrat
from substrat.cli import main
from substrat.rootdir import prepare_root
from substrat.shellword import shell_word

# (a tab, like every character that does not print, is written as $'...', which shlex does
# not read: tests/unit/test_cli_paths_shown.py reads those back with bash)
AWKWARD = ["my roots/r", "it's", "é", "a$b", "-dash", "semi;colon"]


@pytest.mark.parametrize("name", AWKWARD)
def test_a_quoted_path_reads_back_as_itself(name: str) -> None:
    path = f"/srv/{name}"
    assert shlex.split(f"ls {shell_word(path)} x") == ["ls", path, "x"]


def test_a_plain_path_stays_bare() -> None:
    assert shell_word(Path("/tmp/pytest-of-root/x_1.2/root")) == "/tmp/pytest-of-root/x_1.2/root"


def _commands(text: str) -> list[list[str]]:
    return [shlex.split(cmd) for cmd in re.findall(r"`(substrat [^`]*)`", text)]


def test_the_commands_for_a_missing_root_name_it_as_one_word(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "my roots" / "r"
    monkeypatch.delenv("SUBSTRAT_HOME", raising=False)
    result = CliRunner().invoke(main, ["agent", "list", "--no-autostart", "--root", str(root)])
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())  # (rich folds long lines)
    commands = _commands(said)
    assert ["substrat", "daemon", "start", "--root", str(root)] in commands, said
    assert ["substrat", "agent", "create", "NAME", "--root", str(root)] in commands, said


def test_the_command_to_start_a_daemon_names_the_root_as_one_word(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = prepare_root(tmp_path / "my roots" / "r")
    monkeypatch.delenv("SUBSTRAT_HOME", raising=False)
    result = CliRunner().invoke(main, ["agent", "list", "--no-autostart", "--root", str(root)])
    assert result.exit_code == 3, result.output
    said = " ".join(result.output.split())
    assert ["substrat", "daemon", "start", "--root", str(root)] in _commands(said), said


def test_no_message_puts_a_bare_path_after_root() -> None:
    """Every `... --root {path}` in substrat's messages goes through shell_word."""
    bare = []
    for source in Path(substrat.__file__).parent.rglob("*.py"):
        for number, line in enumerate(source.read_text().splitlines(), start=1):
            for found in re.findall(r"--root \{([^{}]*)\}", line):
                if re.fullmatch(r"(esc\()?(shellword\.)?shell_word\(.*\)\)?", found):
                    continue
                if source.name == "shellword.py" and found == "root_word":
                    continue  # rooted() is given the word: Opts.root_word made it by shell_word
                bare.append(f"{source}:{number}: {found}")
    assert not bare, bare
