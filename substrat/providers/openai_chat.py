"""The ``openai`` provider: any OpenAI-compatible chat-completions endpoint.

OpenAI itself, OpenRouter, vLLM, Ollama, a llama.cpp server: anything that
speaks ``POST /chat/completions`` with streaming and function tools, reached
through the official ``openai`` SDK (installed with ``substrat[openai]``; it is
imported only when this provider is first used).

The session's whole state is its message list. Every completed turn's new
messages (the user prompt, assistant messages with their tool calls, the tool
results, the final answer) are its transcript, which the orchestrator logs; a
restore without a current blob rebuilds the list from those transcripts, so
the recovered conversation is exactly what the endpoint was sent, minus the
turn that was in flight. A failed turn changes nothing: its messages are only
kept once it completes.

Module name: ``openai_chat`` so that it never shadows the ``openai`` package.
"""

from __future__ import annotations

import asyncio
import json
import random
import uuid
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from substrat import events
from substrat.errors import (
    ContextOverflowError,
    ProviderConfigError,
    ProviderError,
    ProviderRejectedError,
    ProviderUnavailableError,
    ToolError,
)
from substrat.providers.base import AgentContext, ProviderSession, ToolSpec, TurnRecord
from substrat.providers.chat_history import (
    Message,
    find_orphans,
    rebuild,
    repair_orphans,
    turn_messages,
)
from substrat.providers.openai_config import (
    SETTINGS,
    BrokenStream,
    OpenAIConfig,
    classify,
    describe,
    endpoint_label,
    sdk,
)

BLOB_VERSION = 1
# Local servers (Ollama, vLLM, llama.cpp) ignore the key, but the SDK wants one.
PLACEHOLDER_API_KEY = "no-key-needed"
TOOL_LIMIT_TEXT = (
    "[not run: this turn reached its limit of {limit} tool rounds; answer with what you have]"
)
Sleep = Callable[[float], Awaitable[None]]


def tool_param(spec: ToolSpec) -> dict[str, Any]:
    """An agent tool as a chat-completions function tool."""
    parameters = dict(spec.parameters or {"type": "object"})
    if parameters.get("type") == "object":
        parameters.setdefault("properties", {})  # some servers insist on it
    return {
        "type": "function",
        "function": {
            "name": spec.name,
            "description": spec.description,
            "parameters": parameters,
        },
    }


@dataclass
class _Round:
    """One assistant message being assembled from stream deltas."""

    content: str = ""
    calls: dict[int, dict[str, str]] = field(default_factory=dict)
    finish_reason: str | None = None

    def add(self, chunk: Any) -> None:
        for choice in getattr(chunk, "choices", None) or []:
            if getattr(choice, "index", 0) not in (0, None):
                continue
            delta = choice.delta
            if delta is not None:
                self.content += getattr(delta, "content", None) or ""
                for position, call in enumerate(getattr(delta, "tool_calls", None) or []):
                    index = call.index if call.index is not None else position
                    slot = self.calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
                    if call.id:
                        slot["id"] = call.id
                    function = call.function
                    if function is not None:
                        slot["name"] += function.name or ""
                        slot["arguments"] += function.arguments or ""
            if choice.finish_reason:
                self.finish_reason = choice.finish_reason

    def message(self) -> Message:
        if not self.calls:
            return {"role": "assistant", "content": self.content}
        tool_calls = []
        for index in sorted(self.calls):
            slot = self.calls[index]
            # Some local servers omit ids; the id is the tool's idempotency key.
            call_id = slot["id"] or f"call_{uuid.uuid4().hex[:24]}"
            tool_calls.append(
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": slot["name"], "arguments": slot["arguments"]},
                }
            )
        return {"role": "assistant", "content": self.content or None, "tool_calls": tool_calls}


def _unique_call_ids(message: Message, earlier: list[Message]) -> None:
    """Give every call of ``message`` an id no earlier call in the conversation has.

    Some local servers number calls from zero in every answer; a reused id
    would hit the tool layer's idempotency cache and return a stale result.
    """
    seen = {c["id"] for m in earlier for c in m.get("tool_calls") or [] if isinstance(c, dict)}
    for call in message.get("tool_calls", []):
        if call["id"] in seen:
            call["id"] = f"call_{uuid.uuid4().hex[:24]}"
        seen.add(call["id"])


async def _next_chunk(chunks: AsyncIterator[Any], stall_timeout_s: float) -> Any | None:
    """The stream's next chunk, None at its end; BrokenStream if none comes in time.

    The read timeout cannot see a stall: keep-alive comments are bytes, so they
    reset it, and the SDK drops them without yielding anything.
    """
    try:
        async with asyncio.timeout(stall_timeout_s):
            return await anext(chunks)
    except StopAsyncIteration:
        return None
    except TimeoutError:
        raise BrokenStream(
            f"no part of the answer for {stall_timeout_s:g} s "
            "(SUBSTRAT_OPENAI_STALL_TIMEOUT_S); only keep-alives or nothing came"
        ) from None


class OpenAISession:
    """One conversation with a chat-completions endpoint; its state is the message list."""

    def __init__(
        self,
        provider: OpenAIProvider,
        model: str,
        system_prompt: str,
        messages: list[Message],
        context: AgentContext,
        *,
        turns: int,
    ) -> None:
        self._provider = provider
        self._config = provider.config
        self._model = model
        self._system_prompt = system_prompt
        self._messages = messages
        self._turns = turns
        self._context = context
        self._transcript: list[Message] = []

    @property
    def messages(self) -> list[Message]:
        """The conversation as the next request will start (a copy)."""
        return [dict(m) for m in self._messages]

    async def send(self, prompt: str) -> AsyncIterator[str]:
        base, repair = repair_orphans(self._messages)
        if repair:
            self._context.note(
                events.TOOL_REPAIRED,
                {**repair.to_dict(), "reason": "tool calls without results before a send"},
            )
            self._messages = base
        tools = [tool_param(spec) for spec in self._context.tool_specs()]
        added: list[Message] = [{"role": "user", "content": prompt}]
        limit = self._config.max_tool_rounds_per_turn
        rounds = 0
        said_something = False
        while True:
            final = rounds >= limit
            request = base + added
            assert not find_orphans(request), "about to send orphan tool calls"
            acc = _Round()
            first_text = True
            async for text in self._stream(request, tools, acc, tool_choice_none=final):
                if first_text and said_something:
                    yield "\n"  # keep the answers of successive rounds apart
                first_text = False
                said_something = True
                yield text
            message = acc.message()
            _unique_call_ids(message, base + added)
            added.append(message)
            if "tool_calls" not in message:
                break
            rounds += 1
            for call in message["tool_calls"]:
                if final:
                    result = TOOL_LIMIT_TEXT.format(limit=limit)
                else:
                    result = await self._run_tool(call)
                added.append({"role": "tool", "tool_call_id": call["id"], "content": result})
            if final:
                break
        self._messages = base + added
        self._transcript = added
        self._turns += 1

    async def _run_tool(self, call: Message) -> str:
        function = call["function"]
        raw = function.get("arguments") or "{}"
        try:
            arguments = json.loads(raw)
        except json.JSONDecodeError as exc:
            return f"error: the arguments are not valid JSON ({exc.msg}); send a JSON object"
        if not isinstance(arguments, dict):
            return "error: the arguments must be a JSON object"
        try:
            return await self._context.call_tool(function.get("name", ""), arguments, call["id"])
        except ToolError as exc:
            return f"error: {exc}"

    async def _stream(
        self,
        request: list[Message],
        tools: list[dict[str, Any]],
        acc: _Round,
        *,
        tool_choice_none: bool,
    ) -> AsyncIterator[str]:
        """One request, retried on transient errors; yields only text not yet yielded.

        A retry after a cut stream asks again from the same messages; the text
        already streamed is not repeated, and a retry that says something else
        fails the turn rather than glue two different answers together.
        """
        config = self._config
        kwargs: dict[str, Any] = {"model": self._model, "messages": request, "stream": True}
        if tools:
            kwargs["tools"] = tools
            if tool_choice_none:
                kwargs["tool_choice"] = "none"
        emitted = ""
        attempt = 0
        while True:
            acc.content, acc.calls, acc.finish_reason = "", {}, None
            try:
                stream = await self._provider.open_stream(kwargs)
                try:
                    chunks = stream.__aiter__()
                    while (chunk := await _next_chunk(chunks, config.stall_timeout_s)) is not None:
                        acc.add(chunk)
                        if len(acc.content) > len(emitted):
                            self._check_prefix(emitted, acc.content)
                            fresh = acc.content[len(emitted) :]
                            emitted = acc.content
                            yield fresh
                finally:
                    await stream.close()
                if acc.finish_reason is None:
                    raise BrokenStream("the stream ended without a finish reason")
                self._check_prefix(emitted, acc.content)
                return
            except ProviderError:
                raise
            except Exception as exc:
                kind, retry_after_s = classify(exc)
                where = f"openai endpoint {endpoint_label(config.base_url)} model {self._model}"
                if kind == "unknown":
                    raise
                if kind == "overflow":
                    raise ContextOverflowError(
                        f"{where}: the conversation no longer fits the context window "
                        f"({describe(exc)}); start a fresh agent with a summary"
                    ) from exc
                if kind == "untrusted":
                    raise ProviderConfigError(
                        f"{where}: its TLS certificate is not trusted ({describe(exc)}); for "
                        "a server of your own, point SSL_CERT_FILE at its CA certificate in the "
                        "daemon's environment (then `substrat daemon restart`)"
                    ) from exc
                if kind == "permanent":
                    raise ProviderRejectedError(
                        f"{where} rejected the request ({describe(exc)}); "
                        "check the model name, API key and base URL"
                    ) from exc
                attempt += 1
                if retry_after_s is not None and retry_after_s > config.backoff_cap_s:
                    # Waiting that long inside a turn holds the agent; retrying sooner
                    # only hammers an endpoint that said when it will take requests.
                    raise ProviderUnavailableError(
                        f"{where} asks to wait {retry_after_s:g} s before the next request "
                        f"(Retry-After; {describe(exc)}); nothing of this turn was kept, "
                        "send it again then"
                    ) from exc
                if attempt > config.max_retries:
                    raise ProviderUnavailableError(
                        f"{where} still failing after {config.max_retries} retries "
                        f"({describe(exc)}); nothing of this turn was kept, send it again later"
                    ) from exc
                delay_s = self._provider.backoff_s(attempt, retry_after_s)
                self._context.report(
                    "turn.retrying",
                    {
                        "attempt": attempt,
                        "max_retries": config.max_retries,
                        "delay_s": round(delay_s, 3),
                        "error": describe(exc),
                    },
                )
                await self._provider.sleep(delay_s)

    @staticmethod
    def _check_prefix(emitted: str, content: str) -> None:
        if not content.startswith(emitted):
            raise ProviderUnavailableError(
                "openai: the stream broke after part of the answer was shown and the retry "
                "answered differently; the turn failed and nothing of it was kept"
            )

    def last_transcript(self) -> list[dict[str, Any]]:
        return [dict(m) for m in self._transcript]

    async def suspend(self) -> bytes:
        await self.stop()
        body = {
            "version": BLOB_VERSION,
            "model": self._model,
            "system_prompt": self._system_prompt,
            "turns": self._turns,
            "messages": self._messages,
        }
        return json.dumps(body, ensure_ascii=False).encode("utf-8")

    async def stop(self) -> None:
        return None  # the HTTP client is the provider's, shared by its sessions


class OpenAIProvider:
    """Bare-LLM provider over the chat-completions protocol (see the module docstring)."""

    name = "openai"

    def __init__(
        self,
        config: OpenAIConfig | None = None,
        *,
        sleep: Sleep | None = None,
        rng: random.Random | None = None,
        http_client: Callable[[], Any] | None = None,
    ) -> None:
        """``http_client`` builds the SDK's HTTP client (an ``httpx.AsyncClient``, e.g.
        ``openai.DefaultAsyncHttpxClient(proxy=...)``) for each event loop; default: the
        SDK's own, which loads the system's CA bundle (about 20 ms of CPU) each time."""
        self.config = config if config is not None else OpenAIConfig.from_env()
        self._http_client = http_client
        self.default_model = self.config.default_model
        self.sleep: Sleep = sleep or asyncio.sleep
        self._rng = rng or random.Random()
        # One client (connection pool, TLS context) per event loop, shared by all
        # sessions: building one costs tens of milliseconds, and a restore should not.
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = (
            weakref.WeakKeyDictionary()
        )

    def client(self) -> Any:
        """The SDK client for the running event loop."""
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            openai = sdk()
            config = self.config
            client = openai.AsyncOpenAI(
                base_url=config.base_url,
                api_key=config.api_key or PLACEHOLDER_API_KEY,
                max_retries=0,  # retries are ours: bounded, jittered, and logged in errors
                timeout=openai.Timeout(config.request_timeout_s, connect=config.connect_timeout_s),
                http_client=None if self._http_client is None else self._http_client(),
            )
            self._clients[loop] = client
        return client

    async def open_stream(self, body: dict[str, Any]) -> Any:
        """Start one streamed ``POST /chat/completions`` of ``body`` (no ``stream`` key needed).

        Through the SDK's own ``post`` rather than ``chat.completions.create``:
        ``create`` first walks the whole body against the SDK's parameter
        types to rename and reformat annotated fields, and a chat body has
        none of those, so the walk returns what it was given (a test checks
        that for every shape of message we send). It costs more with every
        turn of the conversation, on the daemon's event loop: about 40% of an
        OpenAI agent's crash-fuzzer CPU. Authentication, the timeout, error
        mapping and the decoding of the stream are the SDK's, as with ``create``.
        """
        openai = sdk()
        from openai.types.chat import ChatCompletion, ChatCompletionChunk

        return await self.client().post(
            "/chat/completions",
            body={**body, "stream": True},
            cast_to=ChatCompletion,
            stream=True,
            stream_cls=openai.AsyncStream[ChatCompletionChunk],
        )

    def models(self) -> list[str]:
        return [self.default_model]

    def backoff_s(self, attempt: int, retry_after_s: float | None = None) -> float:
        """Wait before retry ``attempt`` (1-based): capped exponential, half of it jittered."""
        ceiling = min(self.config.backoff_cap_s, self.config.backoff_base_s * 2 ** (attempt - 1))
        delay = ceiling / 2 + self._rng.uniform(0, ceiling / 2)
        if retry_after_s is not None:
            delay = max(delay, min(retry_after_s, self.config.backoff_cap_s))
        return delay

    def _check_ready(self) -> None:
        sdk()
        if not self.config.api_key and not self.config.base_url:
            raise ProviderConfigError(
                "openai provider: no API key in the daemon's environment; set "
                "SUBSTRAT_OPENAI_API_KEY (or OPENAI_API_KEY), or SUBSTRAT_OPENAI_BASE_URL for a "
                "local server that needs none, where the daemon is started (then "
                "`substrat daemon restart`)"
            ).with_details(settings=list(SETTINGS))

    async def create(
        self, model: str, system_prompt: str, context: AgentContext
    ) -> ProviderSession:
        self._check_ready()
        messages = rebuild(system_prompt, [])
        return OpenAISession(
            self, model or self.default_model, system_prompt, messages, context, turns=0
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
        self._check_ready()
        model = model or self.default_model
        if blob:
            messages, turns = _messages_from_blob(blob, history, system_prompt)
        else:  # the log is the only copy
            messages, turns = rebuild(system_prompt, history), len(history)
        return OpenAISession(self, model, system_prompt, messages, context, turns=turns)


def _messages_from_blob(
    blob: bytes, history: list[TurnRecord], system_prompt: str
) -> tuple[list[Message], int]:
    """The blob's messages and turn count; ProviderError if it is damaged or not current.

    The orchestrator answers that error by restoring again from the log alone,
    so a bad blob costs only the fast path.
    """
    try:
        body = json.loads(blob.decode("utf-8"))
        if not isinstance(body, dict) or body.get("version") != BLOB_VERSION:
            raise ValueError("not an openai-provider blob of a known version")
        messages = body["messages"]
        turns = int(body["turns"])
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise ValueError("its messages are not a list of objects")
    except (ValueError, KeyError, TypeError) as exc:
        raise ProviderError(f"openai: the saved session state is unreadable ({exc})") from exc
    if body.get("system_prompt") != system_prompt:
        raise ProviderError("openai: the saved session state has another system prompt")
    # Current means: as many turns as the log, ending with the log's last turn.
    if history:
        tail = turn_messages(history[-1])
        if turns != len(history) or messages[len(messages) - len(tail) :] != tail:
            raise ProviderError("openai: the saved session state is older than the log")
    return messages, turns
