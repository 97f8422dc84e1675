"""The shadow model: what the orchestrator acknowledged, operation by operation.

The model never reads the disk it is checking. It is built only from what
the orchestrator handed back when an operation succeeded (return values and
``turn.completed`` notifications, which are sent after the turn committed).
So a recovery that loses an acknowledged operation cannot also fool the
model about it.

At most one operation is in flight at a time (the workloads drive the
orchestrator sequentially); when a crash hits, that operation is the one the
checks allow to be all-or-nothing.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from oracle.errors import OracleViolation
from substrat.agents import USER
from substrat.providers.scripted import chain_digest, reply_header


def canonical(transcript: list[dict[str, Any]]) -> str:
    """A transcript as one comparable string (message for message, key order aside).

    orjson's sorted form when it has no ``null`` (orjson writes NaN and the
    infinities as null, json as ``NaN``/``Infinity``, so only there could two
    different transcripts look the same) and orjson takes the value (it refuses
    non-string keys and integers wider than 64 bits); json's otherwise. Which
    form a transcript gets depends on its value alone, so equal transcripts get
    equal strings and different ones different strings, as with json alone
    (which took a fiftieth of the crash fuzzer's CPU, every conversation
    derived again being formatted turn by turn).
    """
    try:
        fast = orjson.dumps(transcript, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        fast = b"null"
    if b"null" not in fast:
        return fast.decode()
    return json.dumps(transcript, sort_keys=True, separators=(",", ":"))


OP_KINDS = frozenset(
    {"create_root", "turn", "terminate", "evict", "ack_user", "recover", "checkpoint"}
)


@dataclass
class ModelAgent:
    agent_id: str
    name: str
    parent_id: str | None
    instructions: str
    provider: str = "scripted"
    turns: list[tuple[str, str, str]] = field(default_factory=list)
    """Acknowledged turns: (prompt, response, transcript as canonical JSON)."""
    children: dict[str, str] = field(default_factory=dict)
    digest: str = ""


@dataclass
class OpRecord:
    index: int
    kind: str
    args: dict[str, Any]
    status: str = "in flight"

    def describe(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in self.args.items())
        return f"#{self.index} {self.kind}({shown}) [{self.status}]"


@dataclass
class ModelState:
    """The acknowledged state: live agents, conversations and inboxes."""

    agents: dict[str, ModelAgent] = field(default_factory=dict)
    roots: dict[str, str] = field(default_factory=dict)
    terminated: set[str] = field(default_factory=set)
    inboxes: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)

    def inbox(self, endpoint: str) -> dict[str, dict[str, Any]]:
        return self.inboxes.setdefault(endpoint, {})

    def copy(self) -> ModelState:
        """An independent copy, several times cheaper than ``copy.deepcopy``.

        Message dicts are shared: the model moves them between inboxes but
        never changes one.
        """
        return ModelState(
            agents={
                key: replace(agent, turns=list(agent.turns), children=dict(agent.children))
                for key, agent in self.agents.items()
            },
            roots=dict(self.roots),
            terminated=set(self.terminated),
            inboxes={key: dict(inbox) for key, inbox in self.inboxes.items()},
        )

    def path(self, agent_id: str) -> str:
        names = []
        current: str | None = agent_id
        while current is not None:
            agent = self.agents[current]
            names.append(agent.name)
            current = agent.parent_id
        return "/".join(reversed(names))

    def add_agent(self, agent: ModelAgent) -> None:
        assert agent.agent_id not in self.agents
        self.agents[agent.agent_id] = agent
        if agent.parent_id is None:
            self.roots[agent.name] = agent.agent_id
        else:
            self.agents[agent.parent_id].children[agent.name] = agent.agent_id

    def subtree(self, agent_id: str) -> list[str]:
        """The agent and its descendants, leaves first."""
        order: list[str] = []
        for child in self.agents[agent_id].children.values():
            order.extend(self.subtree(child))
        order.append(agent_id)
        return order

    def terminate(self, agent_id: str) -> list[str]:
        gone = self.subtree(agent_id)
        for member in gone:
            agent = self.agents.pop(member)
            if agent.parent_id is None:
                self.roots.pop(agent.name, None)
            elif agent.parent_id in self.agents:
                self.agents[agent.parent_id].children.pop(agent.name, None)
            self.terminated.add(member)
            self.inboxes.pop(member, None)
        return gone

    def apply_turn(
        self,
        agent_id: str,
        prompt: str,
        response: str,
        effects: dict[str, Any],
        transcript: list[dict[str, Any]] | None = None,
    ) -> None:
        """Apply one committed turn of ``agent_id``, as the orchestrator defines it."""
        agent = self.agents[agent_id]
        agent.turns.append((prompt, response, canonical(transcript or [])))
        agent.digest = chain_digest(agent.digest, prompt)
        for spawn in effects.get("spawns", []):
            if spawn["agent_id"] not in self.agents:
                self.add_agent(
                    ModelAgent(
                        spawn["agent_id"],
                        spawn["name"],
                        agent_id,
                        spawn["instructions"],
                        spawn.get("provider", agent.provider),
                    )
                )
        for message in effects.get("messages", []):
            recipient = message["recipient"]
            if recipient == USER or recipient in self.agents:
                self.inbox(recipient)[message["message_id"]] = message
        mine = self.inbox(agent_id)
        for message_id in effects.get("delivered", []):
            mine.pop(message_id, None)
        for target in effects.get("terminations", []):
            if target in self.agents:
                self.terminate(target)


class Model:
    """The acknowledged history of one workload run, across crashes."""

    def __init__(self) -> None:
        self.state = ModelState()
        self.trace: list[OpRecord] = []
        self.inflight: OpRecord | None = None
        self.acked_ops = 0

    # -- bookkeeping -----------------------------------------------------------

    def begin(self, kind: str, **args: Any) -> OpRecord:
        assert kind in OP_KINDS, kind
        if self.inflight is not None:
            raise OracleViolation(
                f"operation {kind} began while {self.inflight.describe()} was still in flight",
                trace=self.trace_lines(),
            )
        record = OpRecord(len(self.trace) + 1, kind, args)
        self.trace.append(record)
        self.inflight = record
        return record

    def _ack(self) -> None:
        assert self.inflight is not None
        self.inflight.status = "acked"
        self.inflight = None
        self.acked_ops += 1

    def fail(self, reason: str) -> None:
        """The in-flight operation failed cleanly (not acknowledged, nothing applied)."""
        if self.inflight is not None:
            self.inflight.status = f"failed: {reason}"
            self.inflight = None

    def crashed(self) -> OpRecord | None:
        """A crash hit: the in-flight operation (if any) is the undecided one."""
        record = self.inflight
        if record is not None:
            record.status = "in flight at crash"
        return record

    def settle(self, outcome: ModelState) -> None:
        """After recovery was checked: adopt the outcome the checks accepted."""
        self.state = outcome
        if self.inflight is not None:
            self.inflight.status = "settled by recovery"
            self.inflight = None

    def trace_lines(self, last: int = 40) -> list[str]:
        return [op.describe() for op in self.trace[-last:]]

    # -- acknowledgements --------------------------------------------------------

    def ack_create_root(self, info: dict[str, Any]) -> None:
        self.state.add_agent(
            ModelAgent(info["agent_id"], info["name"], None, info["instructions"], info["provider"])
        )
        self._ack()

    def ack_turn(self, result: dict[str, Any]) -> None:
        agent_id = result["agent_id"]
        agent = self.state.agents.get(agent_id)
        if agent is None:
            raise OracleViolation(
                f"a turn of {agent_id}, which the model says is not alive, was acknowledged",
                trace=self.trace_lines(),
            )
        self.check_scripted_response(agent, result["prompt"], result["response"])
        self.state.apply_turn(
            agent_id,
            result["prompt"],
            result["response"],
            result["effects"],
            result.get("transcript") or [],
        )
        self._ack()

    def ack_terminate(self, agent_ids: list[str]) -> None:
        if agent_ids:
            top = agent_ids[-1]
            if top in self.state.agents:
                self.state.terminate(top)
        self._ack()

    def ack_user(self, message_ids: list[str]) -> None:
        inbox = self.state.inbox(USER)
        for message_id in message_ids:
            inbox.pop(message_id, None)
        self._ack()

    def ack_noop(self) -> None:
        self._ack()

    def check_scripted_response(self, agent: ModelAgent, prompt: str, response: str) -> None:
        """The scripted provider's reply names the digest of every prompt so far.

        A session restored from a stale blob or a lost history answers with
        the wrong digest, so this catches a wrong restore when it happens.
        """
        if agent.provider not in ("scripted", "fake"):
            return
        expected = reply_header(len(agent.turns) + 1, chain_digest(agent.digest, prompt))
        if not response.startswith(expected):
            raise OracleViolation(
                f"agent {agent.name}: response {response.splitlines()[0]!r} does not continue "
                f"the acknowledged conversation (expected it to start with {expected!r}); "
                "the session was restored from the wrong history",
                trace=self.trace_lines(),
            )

    def copy_state(self) -> ModelState:
        return self.state.copy()

    def copy(self) -> Model:
        """An independent copy of the whole model (state, trace and in-flight operation)."""
        twin = copy.copy(self)
        twin.state = self.state.copy()
        twin.trace = [replace(op) for op in self.trace]
        if self.inflight is not None:
            where = next(i for i, op in enumerate(self.trace) if op is self.inflight)
            twin.inflight = twin.trace[where]
        return twin
