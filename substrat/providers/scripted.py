"""The ``scripted`` provider: deterministic, in-process, no API key. The default.

Its behaviour comes from a script. The built-in one reads directives from the
prompt, one per line, and calls the agent tools they name::

    @spawn NAME [INSTRUCTIONS]     @send TARGET TEXT      @ask TARGET TEXT
    @broadcast TEXT                @inbox                 @children
    @inspect TARGET                @complete TEXT         @terminate TARGET

``\\n`` inside TEXT becomes a newline, so a message can carry directives for
the agent that receives it. Other lines are just conversation.

The response starts with :func:`reply_header`, ``#<turn number> scripted
reply; digest of the conversation so far: <digest>``, where the digest chains
every prompt of the conversation so far. A session restored with a lost or
stale history therefore answers differently, which is how the crash fuzzers
notice a provider resumed from the wrong state. A Python callable can replace
the directive script (``ScriptedProvider(script=...)``).
"""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from substrat.errors import ProviderError
from substrat.providers.base import AgentContext, ProviderSession, TurnRecord

CHUNK_CHARS = 32
BLOB_VERSION = 1
MAX_DIRECTIVES_PER_TURN = 64

ScriptResult = str | Awaitable[str]
Script = Callable[[str, list[TurnRecord], AgentContext], ScriptResult]

# directive -> (tool name, argument names; the last one takes the rest of the line)
_DIRECTIVES: dict[str, tuple[str, tuple[str, ...]]] = {
    "spawn": ("spawn_agent", ("name", "instructions")),
    "send": ("send_message", ("recipient", "text")),
    "ask": ("send_message", ("recipient", "text")),
    "broadcast": ("broadcast", ("text",)),
    "inbox": ("check_inbox", ()),
    "children": ("list_children", ()),
    "inspect": ("inspect_agent", ("name",)),
    "complete": ("complete", ("result",)),
    "terminate": ("terminate", ("name",)),
}


def chain_digest(previous: str, prompt: str) -> str:
    """The next link of the conversation digest."""
    return hashlib.sha256(f"{previous}\x00{prompt}".encode()).hexdigest()[:16]


def reply_header(number: int, digest: str) -> str:
    """The first line of a scripted answer: the turn number and the conversation digest."""
    return f"#{number} scripted reply; digest of the conversation so far: {digest}"


def reply_digest(response: str) -> str | None:
    """The conversation digest in a scripted answer's first line (None if it has none)."""
    first = response.split("\n", 1)[0]
    head, sep, digest = first.rpartition(": ")
    return digest if sep and head.endswith("digest of the conversation so far") else None


def parse_directives(prompt: str) -> list[tuple[str, dict[str, Any]]]:
    """The tool calls a prompt's directive lines ask for, in order."""
    calls: list[tuple[str, dict[str, Any]]] = []
    for line in prompt.splitlines():
        if not line.startswith("@") or len(calls) >= MAX_DIRECTIVES_PER_TURN:
            continue
        word, _, rest = line[1:].partition(" ")
        if word not in _DIRECTIVES:
            continue
        tool, names = _DIRECTIVES[word]
        args: dict[str, Any] = {}
        if names:
            parts = rest.split(" ", len(names) - 1) if rest else []
            for name, value in zip(names, parts, strict=False):
                args[name] = value.replace("\\n", "\n")
        if word == "ask":
            args["expect_reply"] = True
        calls.append((tool, args))
    return calls


class ScriptedSession:
    """A scripted conversation; its state is the list of completed turns."""

    def __init__(
        self,
        context: AgentContext,
        turns: list[TurnRecord],
        script: Script | None,
    ) -> None:
        self._context = context
        self._turns = list(turns)
        self._script = script
        self._digest = ""
        for turn in self._turns:
            self._digest = chain_digest(self._digest, turn.prompt)
        self._transcript: list[dict[str, Any]] = []

    @property
    def turns(self) -> list[TurnRecord]:
        return list(self._turns)

    async def send(self, prompt: str) -> AsyncIterator[str]:
        number = len(self._turns) + 1
        digest = chain_digest(self._digest, prompt)
        if self._script is not None:
            produced = self._script(prompt, list(self._turns), self._context)
            body = await produced if inspect.isawaitable(produced) else produced
            lines = [str(body)]
        else:
            lines = []
            for index, (tool, args) in enumerate(parse_directives(prompt)):
                result = await self._context.call_tool(tool, args, f"t{number}c{index}")
                lines.append(f"{tool}: {result}")
        response = "\n".join([reply_header(number, digest), *lines])
        for start in range(0, len(response), CHUNK_CHARS):
            yield response[start : start + CHUNK_CHARS]
        self._turns.append(TurnRecord(f"t{number}", prompt, response))
        self._digest = digest
        self._transcript = [
            {"role": "user", "content": prompt},
            {"role": "assistant", "content": response},
        ]

    def last_transcript(self) -> list[dict[str, Any]]:
        return list(self._transcript)

    async def suspend(self) -> bytes:
        turns = [[t.turn_id, t.prompt, t.response] for t in self._turns]
        return json.dumps({"version": BLOB_VERSION, "turns": turns}).encode()

    async def stop(self) -> None:
        return None


def decode_blob(blob: bytes) -> list[TurnRecord]:
    """The turns a scripted blob holds; ValueError if it is not one."""
    body = json.loads(blob.decode("utf-8"))
    if not isinstance(body, dict) or body.get("version") != BLOB_VERSION:
        raise ValueError("not a scripted-provider blob of a known version")
    return [TurnRecord(str(t[0]), str(t[1]), str(t[2])) for t in body["turns"]]


def one_model_only(provider: str, only: str, model: str) -> None:
    """Refuse a model name other than a provider's one (it would be shown, never used)."""
    if model != only:
        raise ValueError(
            f"the {provider} provider has one model, {only!r}: it answers from the prompt's "
            f"directive lines, not from a model, so the model {model!r} would do nothing. Leave "
            "out --model, or pick a provider that runs one (--provider openai --model ...)"
        )


class ScriptedProvider:
    """Deterministic in-process provider (see the module docstring)."""

    name = "scripted"
    default_model = "directives"

    def __init__(self, script: Script | None = None) -> None:
        self._script = script

    def models(self) -> list[str]:
        return [self.default_model]

    def check_model(self, model: str) -> None:
        one_model_only(self.name, self.default_model, model)

    async def create(
        self, model: str, system_prompt: str, context: AgentContext
    ) -> ProviderSession:
        return ScriptedSession(context, [], self._script)

    async def restore(
        self,
        blob: bytes,
        history: list[TurnRecord],
        *,
        model: str,
        system_prompt: str,
        context: AgentContext,
    ) -> ProviderSession:
        turns = history
        if blob:
            try:
                turns = decode_blob(blob)
            except (ValueError, KeyError, TypeError, IndexError) as exc:
                # The orchestrator answers this by restoring from the log instead.
                raise ProviderError(f"scripted blob is unreadable: {exc}") from exc
        return ScriptedSession(context, turns, self._script)
