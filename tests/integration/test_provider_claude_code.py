"""The claude-code provider driving a fake CLI executable that keeps its own session files."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from substrat import events
from substrat.errors import (
    ContextOverflowError,
    ProviderConfigError,
    ProviderError,
    ProviderRejectedError,
    ProviderUnavailableError,
)
from substrat.providers.base import ProviderSession, TurnRecord
from substrat.providers.claude_code import ClaudeCodeConfig, ClaudeCodeProvider, ClaudeCodeSession
from tests.support import fake_claude
from tests.support.context import RecordingContext, SimulatedCrash

SYSTEM = "You are agent Q."


@pytest.fixture
def cli_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "fake-claude-home"
    home.mkdir()
    monkeypatch.setenv("FAKE_CLAUDE_HOME", str(home))
    return home


@pytest.fixture
def binary(tmp_path: Path) -> Path:
    return fake_claude.install(tmp_path / "bin")


def provider_for(binary: Path, **changes: Any) -> ClaudeCodeProvider:
    return ClaudeCodeProvider(ClaudeCodeConfig(binary=str(binary), **changes))


def invocations(home: Path) -> list[list[str]]:
    lines = (home / "invocations.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def option(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


class Log:
    """Completed turns as the orchestrator would log them."""

    def __init__(self) -> None:
        self.turns: list[TurnRecord] = []

    async def run(self, session: ProviderSession, prompt: str) -> str:
        response = "".join([c async for c in session.send(prompt)])
        number = len(self.turns) + 1
        self.turns.append(TurnRecord(f"t{number}", prompt, response, session.last_transcript()))
        return response


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_a_missing_binary_is_a_clear_error_at_creation(tmp_path: Path) -> None:
    provider = ClaudeCodeProvider(ClaudeCodeConfig(binary=str(tmp_path / "nope" / "claude")))
    with pytest.raises(ProviderConfigError, match="SUBSTRAT_CLAUDE_BIN"):
        run(provider.create("default", "", RecordingContext()))
    with pytest.raises(ProviderConfigError, match="not found"):
        run(provider.restore(b"", [], model="m", system_prompt="", context=RecordingContext()))
    not_executable = tmp_path / "claude"
    not_executable.write_text("#!/bin/sh\n")
    provider = ClaudeCodeProvider(ClaudeCodeConfig(binary=str(not_executable)))
    with pytest.raises(ProviderConfigError, match="not executable"):
        run(provider.create("default", "", RecordingContext()))


def test_configuration_from_the_environment(binary: Path) -> None:
    config = ClaudeCodeConfig.from_env(
        {
            "SUBSTRAT_CLAUDE_BIN": str(binary),
            "SUBSTRAT_CLAUDE_ARGS": "--permission-mode plan",
            "SUBSTRAT_CLAUDE_MODEL": "opus",
            "SUBSTRAT_CLAUDE_FORK": "0",
            "SUBSTRAT_CLAUDE_TURN_TIMEOUT_S": "12",
        }
    )
    assert config.resolve_binary() == str(binary)
    assert config.extra_args == ("--permission-mode", "plan")
    assert (config.default_model, config.fork_each_turn, config.turn_timeout_s) == (
        "opus",
        False,
        12.0,
    )
    with pytest.raises(ProviderConfigError, match="TURN_TIMEOUT_S"):
        ClaudeCodeConfig.from_env({"SUBSTRAT_CLAUDE_TURN_TIMEOUT_S": "soon"})


def test_turns_stream_record_the_session_id_and_resume_by_it(binary: Path, cli_home: Path) -> None:
    provider = provider_for(binary)
    context = RecordingContext()
    log = Log()

    async def main() -> list[str]:
        session = await provider.create("sonnet", SYSTEM, context)
        try:
            return [await log.run(session, p) for p in ("first", "second", "third")]
        finally:
            await session.stop()

    answers = run(main())
    prompts = ["first", "second", "third"]
    assert answers == [
        fake_claude.answer_for(prompts[:n]) for n in (1, 2, 3)
    ]  # each turn continued the same conversation
    ids = [t.transcript[-1]["cli_session_id"] for t in log.turns]
    assert all(ids) and len(set(ids)) == 3  # a fork per turn
    assert log.turns[0].transcript[0] == {"role": "user", "content": "first"}
    [(event, data)] = context.notes
    assert event == events.PROVIDER_SESSION
    assert data == {"provider": "claude-code", "cli_session_id": ids[0], "reason": "created"}
    first, second, third = invocations(cli_home)
    for argv in (first, second, third):
        assert argv[:4] == ["-p", "--output-format", "stream-json", "--verbose"]
        assert option(argv, "--model") == "sonnet"
        assert option(argv, "--append-system-prompt") == SYSTEM
        assert "first" not in argv  # the prompt goes in on stdin
    assert "--resume" not in first
    assert option(second, "--resume") == ids[0] and "--fork-session" in second
    assert option(third, "--resume") == ids[1]


def test_agent_tools_reach_the_cli_through_mcp(binary: Path, cli_home: Path) -> None:
    provider = provider_for(binary)
    context = RecordingContext()

    async def main() -> str:
        session = await provider.create("default", "", context)
        try:
            prompt = '@tool substrat__add {"a": 2, "b": 40}\n@tool substrat__echo {"text": "hi"}'
            return "".join([c async for c in session.send(prompt)])
        finally:
            await session.stop()

    answer = run(main())
    assert "add -> 42" in answer and "echo -> hi" in answer
    assert [(name, args) for name, args, _ in context.calls] == [
        ("add", {"a": 2, "b": 40}),
        ("echo", {"text": "hi"}),
    ]
    call_ids = [call_id for _, _, call_id in context.calls]
    assert len(set(call_ids)) == 2 and all(c.startswith("mcp-") for c in call_ids)
    [argv] = invocations(cli_home)
    assert option(argv, "--allowedTools") == "mcp__substrat__echo,mcp__substrat__add"
    assert "--model" not in argv  # "default" leaves the choice to the CLI


def test_restore_from_the_log_resumes_the_last_completed_turns_session(
    binary: Path, cli_home: Path
) -> None:
    provider = provider_for(binary)
    log = Log()

    async def main() -> str:
        session = await provider.create("default", "", RecordingContext())
        await log.run(session, "one")
        await log.run(session, "two")
        await session.stop()  # evicted, or the daemon died
        restored = await provider.restore(
            b"", log.turns, model="default", system_prompt="", context=RecordingContext()
        )
        try:
            return await log.run(restored, "three")
        finally:
            await restored.stop()

    assert run(main()) == fake_claude.answer_for(["one", "two", "three"])
    last = invocations(cli_home)[-1]
    assert option(last, "--resume") == log.turns[1].transcript[-1]["cli_session_id"]


@pytest.mark.parametrize("fork", [True, False], ids=["fork", "no-fork"])
def test_a_turn_cut_by_a_crash_is_not_in_the_resumed_conversation(
    binary: Path, cli_home: Path, fork: bool
) -> None:
    provider = provider_for(binary, fork_each_turn=fork)
    log = Log()

    async def main() -> str:
        session = await provider.create("default", "", RecordingContext())
        await log.run(session, "one")
        # The CLI has saved the prompt when the daemon dies mid-turn.
        with pytest.raises(ProviderUnavailableError, match="status 3"):
            await log.run(session, "lost\n@die")
        await session.stop()
        restored = await provider.restore(
            b"", log.turns, model="default", system_prompt="", context=RecordingContext()
        )
        try:
            return await log.run(restored, "two")
        finally:
            await restored.stop()

    answer = run(main())
    if fork:
        # Each turn ran in a fork, so the cut one is only in an abandoned fork.
        assert answer == fake_claude.answer_for(["one", "two"])
    else:
        # Without forks the CLI keeps the cut prompt: the limitation the fork avoids.
        assert answer == fake_claude.answer_for(["one", "lost\n@die", "two"])


def test_a_consumer_crash_mid_turn_stops_the_cli(binary: Path, cli_home: Path) -> None:
    provider = provider_for(binary)

    pids: list[int] = []

    async def main() -> ClaudeCodeSession:
        session = await provider.create("default", "", RecordingContext())
        assert isinstance(session, ClaudeCodeSession)
        stream = session.send("@say working\n@sleep 30")
        with pytest.raises(SimulatedCrash):
            async for _ in stream:
                assert session._process is not None
                pids.append(session._process.pid)
                raise SimulatedCrash
        await stream.aclose()  # what the event loop does with an abandoned generator
        await session.stop()
        return session

    started = time.monotonic()
    session = run(main())
    assert time.monotonic() - started < 10  # not the 30 s the CLI meant to sleep
    assert session._process is None
    [pid] = pids
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the CLI is gone (and reaped)


def test_a_cli_that_lost_its_session_gets_the_log_replayed(binary: Path, cli_home: Path) -> None:
    provider = provider_for(binary)
    log = Log()
    context = RecordingContext()

    async def main() -> str:
        session = await provider.create("default", "", RecordingContext())
        await log.run(session, "alpha")
        await log.run(session, "beta")
        await session.stop()
        for path in (cli_home / "sessions").iterdir():
            path.unlink()  # the CLI's own store is gone
        restored = await provider.restore(
            b"", log.turns, model="default", system_prompt="", context=context
        )
        try:
            return await log.run(restored, "gamma")
        finally:
            await restored.stop()

    answer = run(main())
    failed, replayed = invocations(cli_home)[-2:]
    assert "--resume" in failed and "--resume" not in replayed
    sessions = [json.loads(p.read_text()) for p in (cli_home / "sessions").iterdir()]
    [fresh] = sessions
    [preamble] = fresh["prompts"]
    assert "User: alpha" in preamble and "User: beta" in preamble
    assert preamble.endswith("gamma")
    assert answer.startswith("turn 1 ")  # a new CLI session, seeded from the log
    [(event, data)] = context.notes
    assert event == events.PROVIDER_SESSION and data["reason"] == "replayed"


@pytest.mark.parametrize(
    ("prompt", "error", "match"),
    [
        ("@fail the tool budget ran out", ProviderRejectedError, "the tool budget ran out"),
        ("@overflow", ContextOverflowError, "no longer fits"),
        ("@die", ProviderUnavailableError, "exited with status 3"),
    ],
)
def test_cli_failures_fail_the_turn_clearly(
    binary: Path, cli_home: Path, prompt: str, error: type[Exception], match: str
) -> None:
    provider = provider_for(binary)

    async def main() -> None:
        session = await provider.create("default", "", RecordingContext())
        try:
            async for _ in session.send(prompt):
                pass
        finally:
            await session.stop()

    with pytest.raises(error, match=match):
        run(main())


def test_a_turn_past_its_time_limit_is_stopped(binary: Path, cli_home: Path) -> None:
    provider = provider_for(binary, turn_timeout_s=0.5)

    async def main() -> None:
        session = await provider.create("default", "", RecordingContext())
        try:
            async for _ in session.send("@sleep 30"):
                pass
        finally:
            await session.stop()

    with pytest.raises(ProviderUnavailableError, match=r"limit of 0\.5 s"):
        run(main())


def test_blob_round_trip_and_stale_blobs(binary: Path, cli_home: Path) -> None:
    provider = provider_for(binary)
    log = Log()

    async def main() -> None:
        session = await provider.create("default", "", RecordingContext())
        await log.run(session, "one")
        blob = await session.suspend()
        restored = await provider.restore(
            blob, [], model="default", system_prompt="", context=RecordingContext()
        )
        assert isinstance(restored, ClaudeCodeSession)
        assert restored.cli_session_id == log.turns[0].transcript[-1]["cli_session_id"]
        await log.run(restored, "two")
        await restored.stop()
        with pytest.raises(ProviderError, match="older than the log"):
            await provider.restore(
                blob, log.turns, model="default", system_prompt="", context=RecordingContext()
            )
        with pytest.raises(ProviderError, match="unreadable"):
            await provider.restore(
                b"{}", [], model="default", system_prompt="", context=RecordingContext()
            )

    run(main())
    assert log.turns[1].response == fake_claude.answer_for(["one", "two"])


def test_the_fake_cli_insists_on_verbose_with_stream_json(binary: Path, cli_home: Path) -> None:
    import subprocess

    completed = subprocess.run(
        [str(binary), "-p", "--output-format", "stream-json"],
        input="hi",
        capture_output=True,
        text=True,
        env={**os.environ, "FAKE_CLAUDE_HOME": str(cli_home)},
        check=False,
    )
    assert completed.returncode == 1 and "requires --verbose" in completed.stderr
