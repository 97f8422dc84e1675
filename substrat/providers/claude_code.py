"""The ``claude-code`` provider: an agentic CLI that keeps its own conversation.

Each turn runs the CLI once, in print mode with streamed JSON output::

    claude -p --output-format stream-json --verbose [--resume ID --fork-session]
           --mcp-config FILE --allowedTools mcp__substrat__... [--model M]
           [--append-system-prompt S]        (the prompt goes in on stdin)

The CLI stores the conversation itself; substrat keeps only its session id.
The id the CLI reports is written into every completed turn's transcript
(which the orchestrator logs), so a restore after an eviction or a crash
resumes from the id of the last *completed* turn. With ``--fork-session``
(the default) every turn continues in a fresh fork, so a turn that was cut by
a crash lives only in an abandoned fork and the resumed conversation is the
logged one, exactly. If the CLI no longer knows the id (its files were
removed), the provider starts a new CLI session and replays the logged
conversation into its first prompt.

Agent tools reach the CLI through an MCP stdio server (:mod:`substrat.providers.mcp_tools`).
A missing binary is reported when the agent is created, not on its first turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import shutil
import signal
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from substrat import events
from substrat.errors import (
    ContextOverflowError,
    ProviderConfigError,
    ProviderError,
    ProviderRejectedError,
    ProviderUnavailableError,
)
from substrat.providers.base import AgentContext, ProviderSession, TurnRecord
from substrat.providers.mcp_tools import SERVER_NAME, ToolBridge, mcp_config
from substrat.providers.scratch import ScratchDir, make_scratch

BLOB_VERSION = 1
DEFAULT_MODEL = "default"  # let the CLI pick; no --model flag is passed
SCRATCH_PREFIX = "substrat-cc-"
"""The MCP config and tool socket's directory in the temp directory (see :mod:`.scratch`)."""
MAX_LINE_BYTES = 16 * 1024 * 1024
STOP_GRACE_S = 3.0
_MISSING_SESSION = "no conversation found"
_OVERFLOW_MARKERS = ("prompt is too long", "context window", "context length")
_LOGIN_MARKERS = ("not logged in", "please run /login", "invalid api key")


@dataclass(frozen=True)
class ClaudeCodeConfig:
    """How to run the CLI. Every limit carries its unit."""

    binary: str = "claude"
    extra_args: tuple[str, ...] = ()
    default_model: str = DEFAULT_MODEL
    fork_each_turn: bool = True
    turn_timeout_s: float = 1800.0
    max_stderr_bytes: int = 64 * 1024
    max_replay_chars: int = 200_000

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ClaudeCodeConfig:
        env = os.environ if env is None else env
        base = cls()
        timeout = env.get("SUBSTRAT_CLAUDE_TURN_TIMEOUT_S")
        try:
            turn_timeout_s = float(timeout) if timeout else base.turn_timeout_s
        except ValueError:
            raise ProviderConfigError(
                f"claude-code: SUBSTRAT_CLAUDE_TURN_TIMEOUT_S={timeout!r} is not a number"
            ) from None
        return cls(
            binary=env.get("SUBSTRAT_CLAUDE_BIN") or base.binary,
            extra_args=tuple(shlex.split(env.get("SUBSTRAT_CLAUDE_ARGS", ""))),
            default_model=env.get("SUBSTRAT_CLAUDE_MODEL") or base.default_model,
            fork_each_turn=env.get("SUBSTRAT_CLAUDE_FORK", "1") not in ("0", "false", "no"),
            turn_timeout_s=turn_timeout_s,
        )

    def resolve_binary(self) -> str:
        """The CLI's absolute path; ProviderConfigError naming the fix if there is none."""
        candidate = self.binary
        found = shutil.which(candidate)
        if found is None:
            where = "is not executable" if os.path.exists(candidate) else "was not found"
            raise ProviderConfigError(
                f"claude-code: the CLI binary {candidate!r} {where}; install Claude Code "
                "(`npm install -g @anthropic-ai/claude-code`) or set SUBSTRAT_CLAUDE_BIN "
                "to the binary's path"
            )
        return found


@dataclass
class _TurnOutcome:
    text: str = ""
    session_id: str | None = None
    result: dict[str, Any] | None = None
    error: str | None = None
    """The CLI's own error for the turn (``authentication_failed``, ...), with its text."""


class ClaudeCodeSession:
    """One agent's conversation, held by the CLI under ``cli_session_id``."""

    def __init__(
        self,
        provider: ClaudeCodeProvider,
        binary: str,
        model: str,
        system_prompt: str,
        context: AgentContext,
        *,
        cli_session_id: str | None,
        history: list[tuple[str, str]],
    ) -> None:
        self._provider = provider
        self._config = provider.config
        self._binary = binary
        self._model = model
        self._system_prompt = system_prompt
        self._context = context
        self.cli_session_id = cli_session_id
        self._history = history  # (prompt, response) pairs, for a replay if the CLI forgot
        # Why the next id the CLI reports is worth a durable note (None: it is not).
        self._note_reason: str | None = None
        if cli_session_id is None:
            self._note_reason = "replayed" if history else "created"
        self._workdir: ScratchDir | None = None
        self._bridge: ToolBridge | None = None
        self._process: asyncio.subprocess.Process | None = None
        self._transcript: list[dict[str, Any]] = []

    async def _ensure_bridge(self) -> Path:
        if self._workdir is None:
            # In the temp directory, not the root: the socket's path must fit sun_path.
            self._workdir = make_scratch(SCRATCH_PREFIX)  # mode 0700
            self._bridge = ToolBridge(self._context, self._workdir.path / "tools.sock")
            config = self._workdir.path / "mcp.json"
            config.write_text(json.dumps(mcp_config(self._bridge.socket_path)))
        assert self._bridge is not None
        await self._bridge.start()
        return self._workdir.path / "mcp.json"

    def _command(self, config_path: Path, resume: str | None) -> list[str]:
        tools = ",".join(f"mcp__{SERVER_NAME}__{s.name}" for s in self._context.tool_specs())
        command = [self._binary, "-p", "--output-format", "stream-json", "--verbose"]
        command += ["--mcp-config", str(config_path)]
        if tools:
            command += ["--allowedTools", tools]
        if resume:
            command += ["--resume", resume]
            if self._config.fork_each_turn:
                command.append("--fork-session")
        if self._model and self._model != DEFAULT_MODEL:
            command += ["--model", self._model]
        if self._system_prompt:
            command += ["--append-system-prompt", self._system_prompt]
        return command + list(self._config.extra_args)

    async def send(self, prompt: str) -> AsyncIterator[str]:
        config_path = await self._ensure_bridge()
        assert self._bridge is not None
        self._bridge.new_turn(f"mcp-{uuid.uuid4().hex[:12]}")
        outcome = _TurnOutcome()
        resume = self.cli_session_id
        body = prompt if resume or not self._history else self._replay(prompt)
        try:
            async for text in self._run(self._command(config_path, resume), body, outcome):
                yield text
        except _MissingSession:
            # The CLI lost the conversation: start over and replay the log into it. What the
            # failed run reported goes: the real CLI names the unknown id in its result, and
            # kept, that id would stand in for the new session's.
            self.cli_session_id = None
            self._note_reason = "replayed"
            outcome = _TurnOutcome()
            body = self._replay(prompt)
            async for text in self._run(self._command(config_path, None), body, outcome):
                yield text
        if outcome.session_id is None:
            raise ProviderError("claude-code: the CLI never reported a session id")
        self.cli_session_id = outcome.session_id
        self._history.append((prompt, outcome.text))
        self._transcript = [
            {"role": "user", "content": prompt},
            {"role": "assistant", "content": outcome.text, "cli_session_id": outcome.session_id},
        ]

    def _replay(self, prompt: str) -> str:
        """The logged conversation as a preamble, newest turns kept within the limit."""
        if not self._history:
            return prompt
        lines: list[str] = []
        budget = self._config.max_replay_chars
        for old_prompt, response in reversed(self._history):
            entry = f"User: {old_prompt}\nAssistant: {response}\n"
            if len(entry) > budget:
                break
            budget -= len(entry)
            lines.insert(0, entry)
        return (
            "[substrat: your earlier session could not be resumed, so here is the "
            f"conversation so far ({len(lines)} of {len(self._history)} turns, oldest "
            "first); continue from it]\n\n" + "\n".join(lines) + "\n[the new message]\n" + prompt
        )

    async def _run(
        self, command: list[str], prompt: str, outcome: _TurnOutcome
    ) -> AsyncIterator[str]:
        config = self._config
        loop = asyncio.get_running_loop()
        deadline = loop.time() + config.turn_timeout_s
        process = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            limit=MAX_LINE_BYTES,
            start_new_session=True,  # one signal reaches the CLI and its MCP servers
        )
        self._process = process
        assert process.stdin and process.stdout and process.stderr
        stderr_task = asyncio.ensure_future(_read_bounded(process.stderr, config.max_stderr_bytes))
        try:
            process.stdin.write(prompt.encode("utf-8"))
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                await process.stdin.drain()
            process.stdin.close()
            async for event in _events(process.stdout, deadline, config.turn_timeout_s):
                for text in self._absorb(event, outcome):
                    yield text
            await asyncio.wait_for(process.wait(), max(0.1, deadline - loop.time()))
            stderr = await stderr_task
            self._check(process.returncode, outcome, stderr, command)
        finally:
            await _terminate(process)
            stderr_task.cancel()
            self._process = None

    def _absorb(self, event: dict[str, Any], outcome: _TurnOutcome) -> list[str]:
        kind = event.get("type")
        session_id = event.get("session_id")
        if isinstance(session_id, str) and session_id:
            if outcome.session_id is None and self._note_reason is not None:
                self._context.note(
                    events.PROVIDER_SESSION,
                    {
                        "provider": ClaudeCodeProvider.name,
                        "cli_session_id": session_id,
                        "reason": self._note_reason,
                    },
                )
                self._note_reason = None
            outcome.session_id = session_id
        if kind == "assistant":
            message = event.get("message") or {}
            pieces = [
                b.get("text", "")
                for b in message.get("content") or []
                if isinstance(b, dict) and b.get("type") == "text"
            ]
            text = "".join(pieces)
            if event.get("error"):
                # A message the CLI made up to report a failure ("Not logged in"), not the
                # model's answer: it must not stream as one.
                outcome.error = f"{event['error']}: {text}" if text else str(event["error"])
                return []
            if text:
                if outcome.text:
                    text = "\n" + text
                outcome.text += text
                return [text]
        if kind == "result":
            outcome.result = event
            final = event.get("result")
            if not outcome.text and isinstance(final, str) and final and not event.get("is_error"):
                outcome.text = final
                return [final]
        return []

    def _check(
        self, code: int | None, outcome: _TurnOutcome, stderr: str, command: list[str]
    ) -> None:
        result = outcome.result
        detail = (stderr.strip() or (result or {}).get("result") or "").strip()
        if _MISSING_SESSION in detail.lower() and "--resume" in command:
            raise _MissingSession(detail)
        if result is not None and not result.get("is_error") and code == 0:
            return
        text = str((result or {}).get("result") or (result or {}).get("errors") or detail)
        said = " ".join(text.split())[:300]
        if (outcome.error or "").startswith("authentication_failed") or any(
            marker in text.lower() for marker in _LOGIN_MARKERS
        ):
            raise ProviderConfigError(
                f"claude-code: the Claude Code CLI is not logged in (it said: {said}); log in "
                "as the user the daemon runs as (run `claude`, then /login) or set "
                "ANTHROPIC_API_KEY in the daemon's environment, then `substrat daemon restart`"
            ).with_details(settings=["ANTHROPIC_API_KEY"])
        if any(marker in text.lower() for marker in _OVERFLOW_MARKERS):
            raise ContextOverflowError(
                f"claude-code: the conversation no longer fits the model ({text[:500]}); "
                "start a fresh agent with a summary"
            )
        if "unknown option" in detail.lower() and "--fork-session" in detail:
            raise ProviderConfigError(
                "claude-code: this CLI version has no --fork-session; upgrade it, or set "
                "SUBSTRAT_CLAUDE_FORK=0 (a crash may then leave the cut turn in the CLI's memory)"
            )
        if result is not None:
            # The subtype says how the run ended ("success" even when is_error is set), not
            # what went wrong: only a failing one is worth naming.
            subtype = result.get("subtype")
            how = f" ({subtype})" if subtype and subtype != "success" else ""
            raise ProviderRejectedError(
                f"claude-code: the CLI reported an error{how}: {' '.join(text.split())[:1000]}"
            )
        raise ProviderUnavailableError(
            f"claude-code: the CLI exited with status {code} before finishing the turn"
            f"{': ' + detail[-1000:] if detail else ''}; nothing of the turn was kept"
        )

    def last_transcript(self) -> list[dict[str, Any]]:
        return [dict(m) for m in self._transcript]

    async def suspend(self) -> bytes:
        await self.stop()
        kept: list[tuple[str, str]] = []  # only what a replay could use: bounded
        budget = self._config.max_replay_chars
        for pair in reversed(self._history):
            budget -= len(pair[0]) + len(pair[1])
            if budget < 0:
                break
            kept.insert(0, pair)
        body = {
            "version": BLOB_VERSION,
            "cli_session_id": self.cli_session_id,
            "turns": len(self._history),
            "history": kept,
        }
        return json.dumps(body, ensure_ascii=False).encode("utf-8")

    async def stop(self) -> None:
        if self._process is not None:
            await _terminate(self._process)
            self._process = None
        if self._bridge is not None:
            await self._bridge.close()
            self._bridge = None
        if self._workdir is not None:
            self._workdir.remove()
            self._workdir = None


class _MissingSession(Exception):
    """``--resume`` named a session the CLI does not have."""


async def _events(
    stdout: asyncio.StreamReader, deadline: float, timeout_s: float
) -> AsyncIterator[dict[str, Any]]:
    """The JSON objects on the CLI's stdout; other lines are skipped."""
    loop = asyncio.get_running_loop()
    while True:
        remaining = deadline - loop.time()
        try:
            line = await asyncio.wait_for(stdout.readline(), max(0.01, remaining))
        except TimeoutError:
            raise ProviderUnavailableError(
                f"claude-code: the turn ran past its limit of {timeout_s:g} s "
                "(SUBSTRAT_CLAUDE_TURN_TIMEOUT_S); the CLI was stopped"
            ) from None
        except ValueError:  # a line over MAX_LINE_BYTES
            raise ProviderError(
                f"claude-code: the CLI wrote a line over {MAX_LINE_BYTES} bytes"
            ) from None
        if not line:
            return
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if isinstance(event, dict):
                yield event


async def _read_bounded(stream: asyncio.StreamReader, limit_bytes: int) -> str:
    kept = bytearray()
    while chunk := await stream.read(65536):
        kept += chunk
        if len(kept) > limit_bytes:
            del kept[: len(kept) - limit_bytes]  # keep the tail: that is where errors are
    return kept.decode("utf-8", errors="replace")


async def _terminate(process: asyncio.subprocess.Process) -> None:
    if process.returncode is not None:
        return
    for sig, wait_s in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, STOP_GRACE_S)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)
        try:
            await asyncio.wait_for(process.wait(), wait_s)
            return
        except TimeoutError:
            continue


class ClaudeCodeProvider:
    """Runs the Claude Code CLI per turn and resumes it by session id (see the module doc)."""

    name = "claude-code"

    def __init__(self, config: ClaudeCodeConfig | None = None) -> None:
        self.config = config if config is not None else ClaudeCodeConfig.from_env()
        self.default_model = self.config.default_model

    def models(self) -> list[str]:
        return [self.default_model, "sonnet", "opus", "haiku"]

    async def create(
        self, model: str, system_prompt: str, context: AgentContext
    ) -> ProviderSession:
        binary = self.config.resolve_binary()
        return ClaudeCodeSession(
            self, binary, model, system_prompt, context, cli_session_id=None, history=[]
        )

    async def restore(
        self,
        blob: bytes,
        history: list[TurnRecord],
        *,
        model: str,
        system_prompt: str,
        context: AgentContext,
    ) -> ProviderSession:
        binary = self.config.resolve_binary()
        if blob:
            cli_session_id, pairs = _decode_blob(blob, history)
        else:
            cli_session_id = _last_session_id(history)
            pairs = [(t.prompt, t.response) for t in history]
        return ClaudeCodeSession(
            self,
            binary,
            model,
            system_prompt,
            context,
            cli_session_id=cli_session_id,
            history=pairs,
        )


def _last_session_id(history: list[TurnRecord]) -> str | None:
    """The CLI session id of the last completed turn that recorded one."""
    for turn in reversed(history):
        for message in reversed(turn.transcript):
            found = message.get("cli_session_id")
            if isinstance(found, str) and found:
                return found
    return None


def _decode_blob(
    blob: bytes, history: list[TurnRecord]
) -> tuple[str | None, list[tuple[str, str]]]:
    try:
        body = json.loads(blob.decode("utf-8"))
        if not isinstance(body, dict) or body.get("version") != BLOB_VERSION:
            raise ValueError("not a claude-code blob of a known version")
        cli_session_id = body.get("cli_session_id")
        pairs = [(str(p), str(r)) for p, r in body.get("history", [])]
        turns = int(body["turns"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ProviderError(f"claude-code: the saved session state is unreadable ({exc})") from exc
    if history and (turns != len(history) or cli_session_id != _last_session_id(history)):
        raise ProviderError("claude-code: the saved session state is older than the log")
    return (cli_session_id if isinstance(cli_session_id, str) else None), pairs
