"""Runs every command of the README guide, in order, in one shell, on a fresh root.

A command's exit status must be 0 unless the README marks it ``# exits N``;
lines ending in ``&`` run in the background, as they would for a reader. The
test then checks that the output says what the guide says it does.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cli import NOT_INSTALLED, SUBSTRAT, path_with_substrat, stop_or_kill

README = Path(__file__).parents[2] / "README.md"
BLOCK = re.compile(r"```sh\n(.*?)```", re.DOTALL)
EXITS = re.compile(r"#\s*exits\s+(\d+)")
GUIDE_TIMEOUT_S = 90


def guide_commands() -> list[tuple[str, int]]:
    text = README.read_text()
    section = text[text.index("<!-- guide:start -->") : text.index("<!-- guide:end -->")]
    commands: list[tuple[str, int]] = []
    for block in BLOCK.findall(section):
        for line in block.splitlines():
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            marked = EXITS.search(line)
            command = line[: line.index("#")].rstrip() if marked else line.rstrip()
            commands.append((command, int(marked.group(1)) if marked else 0))
    return commands


def guide_script(commands: list[tuple[str, int]]) -> str:
    lines = ["set -u"]
    for index, (command, expected) in enumerate(commands):
        lines.append(f"echo {shlex.quote(f'$ {command}')}")
        lines.append(command)
        if not command.endswith("&"):
            lines.append(
                f'code=$?; if [ "$code" -ne {expected} ]; then echo "guide step {index}: '
                f'exit $code, expected {expected}: {shlex.quote(command)}" >&2; exit 97; fi'
            )
    return "\n".join(lines) + "\nwait\n"


@pytest.fixture
def guide_root(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "home"
    yield root
    stop_or_kill(root)


def guide_env(root: Path) -> dict[str, str]:
    """The guide's shell: its ``substrat`` is the one under test, whatever PATH had first."""
    env = {**os.environ, "SUBSTRAT_HOME": str(root), "COLUMNS": "160"}
    env["PATH"] = path_with_substrat()
    env.pop("SUBSTRAT_NO_AUTOSTART", None)
    return env


def test_guide_has_the_walkthrough_commands() -> None:
    commands = [c for c, _ in guide_commands()]
    for needed in (
        "substrat daemon start",
        "substrat agent create lead",
        "substrat agent send",
        'kill -9 "$(substrat daemon status --pid)"',
        "substrat recover --dry-run",
        "substrat fsck",
        "substrat watch &",
        "substrat daemon stop",
        "substrat agent list --all",
        'substrat agent show "$(substrat agent list -q',
        "printf 'How is the scout doing?\\n/log 1\\n' | substrat chat lead",
    ):
        assert any(c.startswith(needed) for c in commands), needed


@pytest.mark.skipif(not SUBSTRAT, reason=NOT_INSTALLED)
def test_every_guide_command_runs_as_documented(guide_root: Path) -> None:
    script = guide_script(guide_commands())
    env = guide_env(guide_root)
    log_out, log_err = guide_root.parent / "guide.out", guide_root.parent / "guide.err"
    with open(log_out, "w") as out_file, open(log_err, "w") as err_file:
        # Its own process group: whatever the guide leaves running is killed with it.
        shell = subprocess.Popen(
            ["bash", "-c", script],
            stdout=out_file,
            stderr=err_file,
            env=env,
            start_new_session=True,
        )
        try:
            code = shell.wait(timeout=GUIDE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            try:
                os.killpg(shell.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            shell.wait()
    out, err = log_out.read_text(), log_err.read_text()
    assert code == 0, f"exit {code}\nstdout:\n{out}\nstderr:\n{err}"
    # What the prose promises:
    assert "daemon started" in out
    assert "spawned scout" in out
    assert "lead/scout" in out
    assert "Report: the river is mapped." in out
    assert "died (crashed or was killed)" in err  # the send that was in flight
    assert "connection.lost" in out and "connection.restored" in out  # watch reconnected
    assert "daemon.recovered" in out
    assert "LOST IN FLIGHT" in out and "Take your time." in out  # recover --dry-run
    assert "lost in flight: slowpoke turn t1" in out  # daemon start after the crash
    assert "lost in a crash:" in out  # agent show slowpoke
    assert "daemon stopped" in out
    assert "clean" in out.split("$ substrat daemon stop")[-1]
    # An id prefix names an agent; chat confirms its commit; removed agents stay listed.
    shown = out.split('$ substrat agent show "$(substrat agent list -q')[1]
    assert shown.split("\n", 2)[1].startswith("lead  "), shown[:200]
    assert "✓ turn t4 committed" in err  # the chat's turn (lead's fourth)
    listed = out.split("$ substrat agent list --all")[1].split("$ ")[0]
    assert "lead/scout" in listed and "terminated" in listed
    assert "agent lead/scout was terminated at" in err
    assert "watch ends with it" in out  # the background watch ended with the clean stop
