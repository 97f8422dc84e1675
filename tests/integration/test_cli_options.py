"""Options, help pages and small words (issue 14, items 6 and 7).

``--root`` before or after the command, ``--provider`` choices, help for
every option with an example on every page, ``daemon logs``, plurals, and the
scripted provider's answers saying what they are.
"""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click
import pytest
from click.testing import CliRunner

from substrat.cli import main
from substrat.cli.examples import commands
from tests.support.cli import SUBSTRAT, as_json, cli_env, cli_root, read_json_until, run, spawn

pytestmark = pytest.mark.skipif(not SUBSTRAT, reason="the substrat console script is not installed")


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    yield from cli_root(tmp_path)


def test_root_before_the_command_and_on_demo(root: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    env = cli_env(elsewhere)  # SUBSTRAT_HOME names another root: --root must win
    created = run(root, "--root", str(root), "agent", "create", "lead", env=env)
    assert created.returncode == 0, created.stderr
    listed = as_json(run(root, "--root", str(root), "agent", "list", "--json", env=env))
    assert [a["path"] for a in listed] == ["lead"]
    assert not elsewhere.exists()
    # The command's own --root wins over the group's.
    own = run(root, "--root", str(elsewhere), "agent", "list", "--root", str(root), env=env)
    assert own.returncode == 0 and "lead" in own.stdout
    # demo: in a directory of its own choosing, never SUBSTRAT_HOME; kept afterwards.
    refused = run(root, "demo", "--root", str(root), env=env)
    assert refused.returncode == 2 and "needs a new or empty directory" in refused.stderr
    place = tmp_path / "demo-here"
    shown = run(root, "--root", str(place), "demo", "--json", env=env, timeout_s=180)
    assert shown.returncode == 0, shown.stderr
    result = json.loads(shown.stdout)
    assert result["root"] == str(place) and result["survived"] is True
    assert (place / "agents").is_dir()  # kept: it is the user's directory


def test_root_and_json_on_a_group_too(root: Path, tmp_path: Path) -> None:
    """``substrat agent --root R list`` and ``substrat agent --json list`` were refused
    ("No such option"): a group takes them for the command that follows."""
    elsewhere = tmp_path / "elsewhere"
    env = cli_env(elsewhere)  # SUBSTRAT_HOME names another root: the --root given must win
    here = str(root)
    assert run(root, "agent", "create", "lead", "--root", here, env=env).returncode == 0
    for args in (
        ["agent", "--root", here, "list", "--json"],
        ["agent", "--json", "--root", here, "list"],
        ["--json", "agent", "--root", here, "list"],
        ["--json", "--root", here, "agent", "list"],
        # the nearest --root wins: the group's over the top level's
        ["--root", str(elsewhere), "agent", "--json", "--root", here, "list"],
    ):
        assert [a["path"] for a in as_json(run(root, *args, env=env))] == ["lead"], args
    status = as_json(run(root, "daemon", "--json", "--root", here, "status", env=env))
    assert status["running"] is True and status["root"] == here
    stopped = as_json(run(root, "--json", "daemon", "--root", here, "stop", env=env))
    assert stopped["stopped"] is True
    assert not elsewhere.exists()
    helped = run(root, "agent", "--help").stdout
    assert "--root" in helped and "--json" in helped


def test_a_prompt_that_starts_with_a_dash_is_told_to_go_after_dashes(tmp_path: Path) -> None:
    nowhere = ["--root", str(tmp_path / "nowhere")]

    def send(*args: str) -> Any:
        return CliRunner().invoke(main, ["agent", "send", *nowhere, *args], prog_name="substrat")

    for prompt, typed in (("--help me", "'--help me'"), ("-x marks it", "'-x marks it'")):
        refused = send("lead", "--wait", prompt)
        assert refused.exit_code == 2
        assert (
            "a prompt starting with '-' goes after '--': "
            f"substrat agent send {' '.join(nowhere)} lead --wait -- {typed}"
        ) in refused.output.lower(), refused.output
    # Options given before the command's name are in the line to type.
    before = CliRunner().invoke(
        main, ["--json", "agent", *nowhere, "send", "lead", "-x"], prog_name="substrat"
    )
    assert f"substrat agent send {' '.join(nowhere)} --json lead -- -x" in before.output
    # A mistyped option (with the prompt there) keeps click's own message.
    typo = send("--no-strem", "lead", "hi")
    assert typo.exit_code == 2 and "'--no-stream'" in typo.output
    assert "goes after" not in typo.output
    # After '--' it is taken as the prompt: the command goes on (to find no root there).
    taken = send("lead", "--", "--help me")
    assert taken.exit_code == 2 and "no substrat root at" in taken.output


def test_provider_choices_are_listed_and_checked(root: Path) -> None:
    helped = run(root, "agent", "create", "--help").stdout
    for name in ("scripted", "fake", "openai", "claude-code", "paced"):
        assert name in helped
    wrong = run(root, "agent", "create", "lead", "--provider", "opena1")
    assert wrong.returncode == 2
    assert "'opena1' is not one of" in wrong.stderr and "'openai'" in wrong.stderr
    # A model the scripted provider would show but never use is refused, not ignored: by
    # the daemon of an existing root (on a new one, before it is made: test_cli_root_paths).
    assert run(root, "daemon", "start").returncode == 0
    ignored = run(root, "agent", "create", "lead", "--model", "gpt-4o")
    assert ignored.returncode == 1
    assert "the scripted provider has one model, 'directives'" in ignored.stderr
    assert "--provider openai --model" in ignored.stderr
    assert as_json(run(root, "agent", "list", "--json")) == []


def _options(command: click.Command) -> list[click.Option]:
    return [p for p in command.params if isinstance(p, click.Option) and p.name != "help"]


def test_every_help_page_has_an_example_and_every_option_its_help() -> None:
    pages = commands(main)
    assert len(pages) >= 20
    for path, command in pages:
        ctx = click.Context(command, info_name=f"substrat {path}".strip())
        page = command.get_help(ctx)
        assert re.search(r"Examples:\n(?: +.*\n)* +substrat ", page), path
        assert "``" not in page, path  # no reStructuredText markup
        for option in _options(command):
            assert option.help, f"substrat {path} {option.opts[0]} has no help"


def test_help_pages_as_a_user_reads_them(root: Path) -> None:
    agent = run(root, "agent", "--help")
    assert agent.returncode == 0 and "``" not in agent.stdout
    assert "lead/worker" in agent.stdout and "Examples:" in agent.stdout
    status = run(root, "daemon", "status", "--help").stdout
    assert "Seconds to wait for a running daemon to answer." in " ".join(status.split())


def test_daemon_logs_prints_and_follows(root: Path) -> None:
    run(root, "daemon", "start")
    tail = run(root, "daemon", "logs", "-n", "3")
    assert tail.returncode == 0
    lines = tail.stdout.splitlines()
    assert 0 < len(lines) <= 3 and "ready: listening on" in tail.stdout
    follower = spawn(root, "daemon", "logs", "-f", "-n", "1", "--json")
    # Its first line (the log's last) is out: from here on it follows, whatever the load.
    (last,) = read_json_until(follower, lambda e: True)
    assert last["line"] == lines[-1]
    run(root, "daemon", "stop")
    seen = read_json_until(follower, lambda e: "stopped cleanly" in e["line"])
    assert any("stopping" in e["line"] for e in seen)
    follower.send_signal(signal.SIGINT)
    follower.communicate(timeout=30)
    assert follower.returncode == 130


def test_daemon_logs_follows_from_where_its_tail_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A line the daemon writes while ``logs -f -n N`` reads the tail is printed, not
    skipped (it sought to the end after the tail, past such a line)."""
    from substrat.cli import daemon_cmds
    from substrat.rootdir import prepare_root

    root = prepare_root(tmp_path / "root")
    log = root / "daemon.log"
    log.write_text("one\ntwo\n")
    real_deque = daemon_cmds.deque

    def tail_while_the_daemon_writes(handle: Any, maxlen: int) -> Any:
        tail = real_deque(handle, maxlen=maxlen)
        with open(log, "a") as daemon:
            daemon.write("three\n")
        return tail

    def interrupt(_seconds: float) -> None:
        raise KeyboardInterrupt  # the user's Ctrl-C, once nothing more is to be read

    monkeypatch.setattr(daemon_cmds, "deque", tail_while_the_daemon_writes)
    monkeypatch.setattr(daemon_cmds, "time", SimpleNamespace(sleep=interrupt))
    shown = CliRunner().invoke(main, ["daemon", "logs", "-f", "-n", "1", "--root", str(root)])
    assert shown.output.splitlines() == ["two", "three"], shown.output


def test_counts_read_right_and_scripted_answers_say_what_they_are(root: Path) -> None:
    run(root, "agent", "create", "lead")
    sent = run(root, "agent", "send", "lead", "go\n@spawn scout look\n@send scout hi")
    assert sent.stdout.startswith("#1 scripted reply; digest of the conversation so far: ")
    assert "spawned scout · sent 1 message" in sent.stderr
    shown = run(root, "agent", "show", "lead").stdout
    assert "1 live children" not in shown
    refused = run(root, "agent", "rm", "lead")
    assert "1 live child (lead/scout)" in refused.stderr
    removed = run(root, "agent", "rm", "lead", "--cascade")
    assert "terminated 2 agents: lead/scout, lead" in removed.stdout
    inbox = run(root, "inbox", "--collect")
    assert "(s)" not in inbox.stdout + inbox.stderr
