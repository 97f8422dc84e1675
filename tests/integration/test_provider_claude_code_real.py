"""The claude-code provider against the real Claude Code CLI, for everything that needs no login.

The CLI comes from the npm registry (``tests/support/real_claude.py`` installs
it once into a cache); without npm, or when the install fails, these tests
skip and say why. It runs logged out (a fresh ``HOME``, no credentials), so
every turn ends in the CLI's "Not logged in": what is tested is that every
flag the provider passes is accepted, that its stream-json is parsed (the
session id, a resumed and forked session, a missing one replayed), and that
the user gets one clear line saying the CLI is not logged in and how to fix
it for the daemon. Turns that need a model use the fake CLI
(``test_provider_claude_code.py``).
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from substrat import events
from substrat.errors import ProviderConfigError
from substrat.providers.base import TurnRecord
from substrat.providers.claude_code import ClaudeCodeConfig, ClaudeCodeProvider
from tests.support import real_claude
from tests.support.cli import SUBSTRAT, cli_env, cli_root, run
from tests.support.context import RecordingContext

UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


@pytest.fixture(scope="session")
def claude() -> Path:
    try:
        return real_claude.claude_binary()
    except real_claude.Unavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture
def logged_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A HOME where the CLI has no login, for the CLI the provider runs in this process."""
    home = tmp_path / "home"
    home.mkdir()
    for name, value in real_claude.logged_out_env(home).items():
        monkeypatch.setenv(name, value)
    for name in real_claude.CREDENTIALS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    return home


def turn(provider: ClaudeCodeProvider, ctx: RecordingContext, history: list[TurnRecord]) -> str:
    """Run one turn; return what streamed (it fails: the CLI is not logged in)."""

    async def go() -> str:
        if history:
            session = await provider.restore(
                b"", history, model="sonnet", system_prompt="You lead.", context=ctx
            )
        else:
            session = await provider.create("sonnet", "You lead.", ctx)
        shown = ""
        try:
            async for chunk in session.send("Hello?"):
                shown += chunk
        finally:
            await session.stop()
        return shown

    streamed: list[str] = []

    async def capture() -> None:
        streamed.append(await go())

    with pytest.raises(ProviderConfigError) as failure:
        asyncio.run(capture())
    message = str(failure.value)
    assert "\n" not in message
    assert message.startswith("claude-code: the Claude Code CLI is not logged in (it said: ")
    assert "ANTHROPIC_API_KEY in the daemon's environment" in message
    assert "substrat daemon restart" in message and "(success)" not in message
    return "".join(streamed)


def test_every_flag_is_accepted_and_the_session_id_is_read(claude: Path, logged_out: Path) -> None:
    provider = ClaudeCodeProvider(ClaudeCodeConfig(binary=str(claude)))
    ctx = RecordingContext()
    # -p, stream-json, --verbose, --mcp-config, --allowedTools, --model, --append-system-prompt
    streamed = turn(provider, ctx, [])
    assert streamed == ""  # the CLI's made-up "Not logged in" message is not an answer
    (note,) = [d for e, d in ctx.notes if e == events.PROVIDER_SESSION]
    assert note["reason"] == "created" and UUID.match(note["cli_session_id"]), note
    created = note["cli_session_id"]
    # --resume ID --fork-session: accepted; the fork is a session of its own.
    resumed = TurnRecord(
        "t1", "Hello?", "Hi.", [{"role": "assistant", "content": "Hi.", "cli_session_id": created}]
    )
    ctx = RecordingContext()
    turn(provider, ctx, [resumed])
    assert not [d for e, d in ctx.notes if e == events.PROVIDER_SESSION]  # resumed, not replayed
    # A session the CLI does not know ("No conversation found"): replayed into a new one.
    gone = TurnRecord(
        "t1",
        "Hello?",
        "Hi.",
        [{"role": "assistant", "content": "Hi.", "cli_session_id": str(uuid.uuid4())}],
    )
    ctx = RecordingContext()
    turn(provider, ctx, [gone])
    (note,) = [d for e, d in ctx.notes if e == events.PROVIDER_SESSION]
    assert note["reason"] == "replayed" and note["cli_session_id"] != created


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    yield from cli_root(tmp_path)


@pytest.mark.skipif(not SUBSTRAT, reason="the substrat console script is not installed")
def test_not_logged_in_is_one_clear_line_from_the_command_line(
    claude: Path, root: Path, tmp_path: Path
) -> None:
    home = tmp_path / "daemon-home"
    home.mkdir()
    env = real_claude.logged_out_env(home, cli_env(root))
    env["SUBSTRAT_CLAUDE_BIN"] = str(claude)
    assert run(root, "daemon", "start", env=env).returncode == 0
    created = run(root, "agent", "create", "cc", "--provider", "claude-code", env=env)
    assert created.returncode == 0, created.stderr
    sent = run(root, "agent", "send", "cc", "Hello?", env=env)
    assert sent.returncode == 1
    assert sent.stdout == ""  # "Not logged in" is the CLI's error, not the agent's answer
    errors = [line for line in sent.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, sent.stderr
    (line,) = errors
    assert line.startswith("error: claude-code: the Claude Code CLI is not logged in"), line
    assert "(it said: Not logged in" in line and "substrat daemon restart" in line
    assert "loginerror" not in sent.stderr and "(success)" not in sent.stderr
    assert "✗ not committed" in sent.stderr
