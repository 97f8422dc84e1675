"""Agent tools, and the effects a turn stages for its commit.

A tool call never writes to disk. It stages an effect (a child to spawn, a
message to send, a child to terminate, inbox messages consumed) on the turn's
:class:`TurnEffects`; the orchestrator writes them all in the turn's
``turn.complete`` entry (the commit point) and only then applies them. So a
turn is all or nothing: a crash before the commit leaves no trace of its tool
calls, and a crash after it is rolled forward by recovery.

Every call carries an idempotency key (the provider's tool-call id, or a hash
of caller, tool and arguments): a call repeated within a turn returns the
first call's result and stages nothing new.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from substrat.agents import (
    USER,
    AgentNode,
    AgentState,
    AgentTree,
    InboxRegistry,
    MessageEnvelope,
    validate_name,
)
from substrat.errors import AgentNotFoundError
from substrat.providers.base import ToolSpec
from substrat.words import plural

if TYPE_CHECKING:
    from collections.abc import Callable

    from substrat.queries import AgentInfo

StatusSink = Callable[[str, dict[str, Any]], None]
"""Told ``(event, data)`` while a turn runs: ``turn.tool``, ``turn.retrying``, ..."""

MAX_PAYLOAD_CHARS = 64 * 1024
MAX_CHILDREN_PER_AGENT = 64
MAX_CALLS_PER_TURN = 256
MAX_INSTRUCTIONS_CHARS = 16 * 1024


@dataclass
class TurnEffects:
    """What one turn will do when it commits (plain JSON once serialised)."""

    turn_id: str
    spawns: list[dict[str, Any]] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    terminations: list[str] = field(default_factory=list)
    delivered: list[str] = field(default_factory=list)
    results: dict[str, str] = field(default_factory=dict)
    consumed: list[MessageEnvelope] = field(default_factory=list)
    calls: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "spawns": self.spawns,
            "messages": self.messages,
            "terminations": self.terminations,
            "delivered": self.delivered,
            "keys": sorted(self.results),
        }


TOOL_SPECS: list[ToolSpec] = [
    ToolSpec(
        "spawn_agent",
        "Create a child agent. It starts after your turn ends.",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "description": "unique among your children"},
                "instructions": {"type": "string", "description": "the child's system prompt"},
            },
            "required": ["name"],
        },
    ),
    ToolSpec(
        "send_message",
        "Send a message to 'user', 'parent', a child, a sibling, a path or an agent id. "
        "With expect_reply the recipient's answer comes back to you as a message.",
        {
            "type": "object",
            "properties": {
                "recipient": {"type": "string"},
                "text": {"type": "string"},
                "expect_reply": {"type": "boolean"},
            },
            "required": ["recipient", "text"],
        },
    ),
    ToolSpec(
        "broadcast",
        "Send a message to all your siblings (a root agent: to all its children).",
        {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    ),
    ToolSpec("check_inbox", "Read the messages waiting for you.", {"type": "object"}),
    ToolSpec(
        "inspect_agent",
        "Show an agent's state, children and pending messages.",
        {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
    ),
    ToolSpec("list_children", "List your children and their states.", {"type": "object"}),
    ToolSpec(
        "complete",
        "Report your result to your parent (a root agent: to the user).",
        {"type": "object", "properties": {"result": {"type": "string"}}, "required": ["result"]},
    ),
    ToolSpec(
        "terminate",
        "Terminate one of your children (and its whole subtree) after your turn ends.",
        {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
    ),
]


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "boolean": (bool,),
    "integer": (int,),
    "number": (int, float),
    "object": (dict,),
    "array": (list,),
}
MAX_REPORTED_CHARS = 300
"""Longest argument or result text in a ``turn.tool`` event (the commit keeps it all)."""


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    for name, kinds in (("a number", (int, float)), ("a string", (str,))):
        if isinstance(value, kinds):
            return name
    return "an array" if isinstance(value, list) else "an object"


def argument_problem(spec: ToolSpec, arguments: dict[str, Any]) -> str | None:
    """Why ``arguments`` do not fit ``spec``, in the tool's own terms; None if they do."""
    properties: dict[str, Any] = spec.parameters.get("properties") or {}
    required = [r for r in spec.parameters.get("required") or [] if r not in arguments]
    if required:
        wanted = ", ".join(
            f"{r} ({properties.get(r, {}).get('description') or properties.get(r, {}).get('type')})"
            for r in required
        )
        noun = "argument" if len(required) == 1 else "arguments"
        return f"{spec.name} needs the {noun} {wanted}"
    unknown = sorted(set(arguments) - set(properties))
    if unknown:
        takes = ", ".join(properties) or "none"
        noun = "argument" if len(unknown) == 1 else "arguments"
        return f"{spec.name} has no {noun} {', '.join(unknown)}; its arguments are: {takes}"
    for name, value in arguments.items():
        kinds = _JSON_TYPES.get(properties[name].get("type", ""))
        if kinds is None:
            continue
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            want = properties[name]["type"]
            article = "an" if want[0] in "aeiou" else "a"
            return f"{name} must be {article} {want} (got {_json_type(value)})"
    return None


def _clip(value: Any) -> Any:
    """Long strings shortened for an event (events are for watching, not for records)."""
    if isinstance(value, str) and len(value) > MAX_REPORTED_CHARS:
        return value[: MAX_REPORTED_CHARS - 1] + "…"
    if isinstance(value, dict):
        clipped = dict(value)  # the same keys in the same order, members replaced in place
        for key, member in value.items():
            if type(member) not in _NEVER_CLIPPED:  # every tool call reports its arguments:
                clipped[key] = _clip(member)  # no call for a short string or a number
            elif type(member) is str and len(member) > MAX_REPORTED_CHARS:
                clipped[key] = _clip(member)
        return clipped
    if isinstance(value, list):
        return [_clip(member) for member in value]
    return value


_NEVER_CLIPPED = frozenset({str, int, float, bool, type(None)})
"""Types whose values :func:`_clip` returns as they are (a ``str`` when it is short)."""


def idempotency_key(caller: str, tool: str, arguments: dict[str, Any], call_id: str) -> str:
    if call_id:
        return call_id
    blob = json.dumps([caller, tool, arguments], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def render_messages(orch: DescribesEndpoints, messages: list[MessageEnvelope]) -> str:
    """Messages as prompt text: a header line each, then the payload."""
    parts = []
    for message in messages:
        sender = orch.describe_endpoint(message.sender)
        header = f"[{message.kind} {message.message_id} from {sender}"
        if message.reply_to:
            header += f", replying to {message.reply_to}"
        parts.append(header + "]\n" + message.payload)
    return "\n".join(parts)


class DescribesEndpoints(Protocol):
    def describe_endpoint(self, endpoint: str) -> str: ...


class ToolHost(DescribesEndpoints, Protocol):
    """What the tools need of the orchestrator (they read; only the commit writes)."""

    tree: AgentTree
    inboxes: InboxRegistry
    new_id: Callable[[], str]
    clock: Callable[[], str]

    def get(self, agent: str) -> AgentInfo: ...

    def log_provider_note(self, node: AgentNode, event: str, data: dict[str, Any]) -> None: ...

    def emit(self, kind: str, payload: dict[str, Any]) -> None: ...


class ToolError(Exception):
    """A refused call; its text goes back to the model as the tool result."""


class AgentToolContext:
    """The :class:`~substrat.providers.base.AgentContext` of one agent.

    Stable for the agent's lifetime (providers keep it); ``effects`` is swapped
    in for each turn.
    """

    def __init__(self, orch: ToolHost, node: AgentNode) -> None:
        self._orch = orch
        self._node = node
        self.effects: TurnEffects | None = None
        self.on_status: StatusSink | None = None
        """The caller of the running turn, told what the turn does (set per turn)."""

    @property
    def session_id(self) -> str:
        return self._node.session_id

    @property
    def agent_name(self) -> str:
        return self._node.name

    def tool_specs(self) -> list[ToolSpec]:
        return list(TOOL_SPECS)

    def note(self, event: str, data: dict[str, Any]) -> None:
        self._orch.log_provider_note(self._node, event, data)

    def report(self, event: str, data: dict[str, Any]) -> None:
        """Publish ``event`` for watchers and tell the turn's caller; nothing is logged."""
        turn_id = self.effects.turn_id if self.effects is not None else None
        payload = {"agent_id": self._node.agent_id, "turn_id": turn_id, **_clip(data)}
        self._orch.emit(event, payload)
        if self.on_status is not None:
            self.on_status(event, payload)

    async def call_tool(self, name: str, arguments: dict[str, Any], call_id: str) -> str:
        effects = self.effects
        if effects is None:
            return "error: tools can only be called during a turn"
        key = idempotency_key(self._node.agent_id, name, arguments, call_id)
        if key in effects.results:
            return effects.results[key]
        if effects.calls >= MAX_CALLS_PER_TURN:
            return f"error: more than {MAX_CALLS_PER_TURN} tool calls in one turn"
        effects.calls += 1
        handler = getattr(self, f"_tool_{name}", None)
        spec = next((s for s in TOOL_SPECS if s.name == name), None)
        if handler is None or spec is None:
            known = ", ".join(s.name for s in TOOL_SPECS)
            result = f"error: unknown tool {name!r}; the tools are: {known}"
        elif (problem := argument_problem(spec, arguments)) is not None:
            result = f"error: {problem}"
        else:
            try:
                result = handler(effects, **arguments)
            except (ToolError, ValueError, AgentNotFoundError) as exc:
                result = f"error: {exc}"
        effects.results[key] = result
        self.report(
            "turn.tool",
            {"tool": name, "call_id": call_id, "arguments": arguments, "result": result},
        )
        return result

    # -- helpers ---------------------------------------------------------

    def _resolve(self, effects: TurnEffects, ref: str) -> str:
        """An endpoint id for ``ref``, relative to this agent; children staged this turn count."""
        orch, node = self._orch, self._node
        if not isinstance(ref, str):  # a model's bad JSON must not fail the whole turn
            raise ToolError(f"an agent reference must be a string, not {type(ref).__name__}")
        if ref == USER:
            return USER
        if ref == "parent":
            return node.parent_id or USER
        for spawn in effects.spawns:
            if spawn["name"] == ref:
                return str(spawn["agent_id"])
        if ref in node.children:
            return node.children[ref]
        if node.parent_id is not None:
            parent = orch.tree.get(node.parent_id)
            if ref in parent.children:
                return parent.children[ref]
        return orch.tree.resolve(ref).agent_id

    def _text(self, text: object) -> str:
        if not isinstance(text, str):
            raise ToolError("text must be a string")
        if len(text) > MAX_PAYLOAD_CHARS:
            raise ToolError(f"message is over {MAX_PAYLOAD_CHARS} characters")
        return text

    def _stage_message(
        self,
        effects: TurnEffects,
        recipient: str,
        kind: str,
        text: str,
        reply_to: str | None = None,
    ) -> str:
        if recipient == self._node.agent_id:
            raise ToolError("an agent cannot message itself")
        message = MessageEnvelope(
            message_id=self._orch.new_id(),
            sender=self._node.agent_id,
            recipient=recipient,
            kind=kind,
            payload=text,
            timestamp=self._orch.clock(),
            reply_to=reply_to,
            metadata={"turn_id": effects.turn_id},
        )
        effects.messages.append(message.to_dict())
        return message.message_id

    # -- tools -----------------------------------------------------------

    def _tool_spawn_agent(self, effects: TurnEffects, name: str, instructions: str = "") -> str:
        validate_name(name)
        if not isinstance(instructions, str) or len(instructions) > MAX_INSTRUCTIONS_CHARS:
            raise ToolError(f"instructions must be a string of at most {MAX_INSTRUCTIONS_CHARS}")
        node = self._node
        staged = {s["name"] for s in effects.spawns}
        if name in node.children or name in staged:
            raise ToolError(f"you already have a child named {name!r}")
        if len(node.children) + len(staged) >= MAX_CHILDREN_PER_AGENT:
            raise ToolError(f"at most {MAX_CHILDREN_PER_AGENT} children per agent")
        agent_id = self._orch.new_id()
        effects.spawns.append(
            {
                "agent_id": agent_id,
                "session_id": self._orch.new_id(),
                "name": name,
                "instructions": instructions,
                "provider": node.provider,
                "model": node.model,
            }
        )
        return f"spawned {name} ({agent_id}); it starts when this turn ends"

    def _tool_send_message(
        self, effects: TurnEffects, recipient: str, text: str, expect_reply: bool = False
    ) -> str:
        target = self._resolve(effects, recipient)
        kind = "request" if expect_reply else "notification"
        message_id = self._stage_message(effects, target, kind, self._text(text))
        suffix = "; the reply will come to your inbox" if expect_reply else ""
        return f"sent message {message_id} to {self._describe(effects, target)}{suffix}"

    def _describe(self, effects: TurnEffects, endpoint: str) -> str:
        """An endpoint by path; a child spawned earlier in this turn has one already."""
        for spawn in effects.spawns:
            if spawn["agent_id"] == endpoint:
                return f"{self._orch.describe_endpoint(self._node.agent_id)}/{spawn['name']}"
        return self._orch.describe_endpoint(endpoint)

    def _tool_broadcast(self, effects: TurnEffects, text: str) -> str:
        node, tree = self._node, self._orch.tree
        if node.parent_id is None:
            targets = [c.agent_id for c in tree.children(node.agent_id)]
        else:
            targets = [s.agent_id for s in tree.siblings(node.agent_id)]
        payload = self._text(text)
        for target in targets:
            self._stage_message(effects, target, "broadcast", payload)
        return f"broadcast to {plural(len(targets), 'agent')}"

    def _tool_check_inbox(self, effects: TurnEffects) -> str:
        taken = self._orch.inboxes.inbox(self._node.agent_id).claim(effects.turn_id)
        effects.consumed.extend(taken)
        effects.delivered.extend(m.message_id for m in taken)
        if not taken:
            return "inbox empty"
        return render_messages(self._orch, taken)

    def _tool_inspect_agent(self, effects: TurnEffects, name: str) -> str:
        target = self._resolve(effects, name)
        if target == USER:
            return "user: the human operator"
        return json.dumps(self._orch.get(target).to_dict(), sort_keys=True)

    def _tool_list_children(self, effects: TurnEffects) -> str:
        children = self._orch.tree.children(self._node.agent_id)
        listed = [f"{c.name} ({c.state.value})" for c in children]
        listed += [f"{s['name']} (starting)" for s in effects.spawns]
        return ", ".join(listed) if listed else "no children"

    def _tool_complete(self, effects: TurnEffects, result: str) -> str:
        target = self._node.parent_id or USER
        message_id = self._stage_message(effects, target, "result", self._text(result))
        return f"result {message_id} sent to {self._describe(effects, target)}"

    def _tool_terminate(self, effects: TurnEffects, name: str) -> str:
        child_id = self._node.children.get(name)
        if child_id is None:
            raise ToolError(f"you have no live child named {name!r}")
        if child_id in effects.terminations:
            raise ToolError(f"{name} is already being terminated")
        if self._orch.tree.get(child_id).state is AgentState.BUSY:
            raise ToolError(f"{name} is running a turn; try again later")
        effects.terminations.append(child_id)
        return f"{name} will be terminated when this turn ends"
