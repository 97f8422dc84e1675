"""A small AgentContext for provider tests that run without an orchestrator."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from substrat.providers.base import ToolSpec

ToolFunction = Callable[[dict[str, Any]], str | Awaitable[str]]

ECHO_SPEC = ToolSpec(
    "echo",
    "Repeat the text back.",
    {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
)
ADD_SPEC = ToolSpec(
    "add",
    "Add two integers.",
    {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
)


def _add(args: dict[str, Any]) -> str:
    return str(int(args["a"]) + int(args["b"]))


class RecordingContext:
    """Runs a few local tools and records every call and note."""

    def __init__(self, tools: dict[str, tuple[ToolSpec, ToolFunction]] | None = None) -> None:
        self.tools = tools or {
            "echo": (ECHO_SPEC, lambda args: str(args.get("text", ""))),
            "add": (ADD_SPEC, _add),
        }
        self.calls: list[tuple[str, dict[str, Any], str]] = []
        self.notes: list[tuple[str, dict[str, Any]]] = []
        self.reports: list[tuple[str, dict[str, Any]]] = []
        self.before_call: Callable[[str, dict[str, Any], str], None] | None = None

    @property
    def session_id(self) -> str:
        return "0" * 32

    @property
    def agent_name(self) -> str:
        return "tester"

    def tool_specs(self) -> list[ToolSpec]:
        return [spec for spec, _ in self.tools.values()]

    async def call_tool(self, name: str, arguments: dict[str, Any], call_id: str) -> str:
        if self.before_call is not None:
            self.before_call(name, arguments, call_id)  # may raise to simulate a crash
        self.calls.append((name, arguments, call_id))
        if name not in self.tools:
            return f"error: unknown tool {name!r}"
        result = self.tools[name][1](arguments)
        if not isinstance(result, str):
            result = await result
        return result

    def note(self, event: str, data: dict[str, Any]) -> None:
        self.notes.append((event, data))

    def report(self, event: str, data: dict[str, Any]) -> None:
        self.reports.append((event, data))


class SimulatedCrash(BaseException):
    """Raised to stop a turn dead, as a kill would: nothing catches a BaseException."""


class RecordingSleep:
    """Stands in for asyncio.sleep in retry tests: records the waits, waits not."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
