"""Workload steps and the driver that runs them while keeping the model in step.

A :class:`Step` names agents by path (``alpha/w1``), which stays meaningful
across crashes, and uses scripted-provider directives for what agents do. The
:class:`Driver` runs steps against an orchestrator and reports every
acknowledgement to the :class:`~oracle.model.Model`; turns are tracked through
the orchestrator's ``turn.started`` / ``turn.completed`` notifications, so
turns the wake loop runs are tracked exactly like direct ones.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from oracle.model import Model
from substrat.errors import OutcomeUnknownError, SubstratError

if TYPE_CHECKING:
    from substrat.orchestrator import Orchestrator

STEP_KINDS = (
    "create_root",
    "spawn",
    "send",
    "ask",
    "broadcast",
    "inbox",
    "complete",
    "turn",
    "terminate",
    "terminate_by_parent",
    "evict",
    "pending",
    "user_inbox",
    "checkpoint",
)
ASKED_KINDS = ("stop",)
"""Steps run only where a machine or a scenario asks for them, never drawn from STEP_KINDS:
``stop``, a clean stop and a start (see Driver)."""
MAX_WAKE_TURNS_PER_STEP = 12


@dataclass(frozen=True)
class Step:
    """One workload operation. ``a`` and ``b`` are agent paths or names."""

    kind: str
    a: str = ""
    b: str = ""

    def __post_init__(self) -> None:
        assert self.kind in STEP_KINDS or self.kind in ASKED_KINDS, self.kind

    def __str__(self) -> str:
        return " ".join(x for x in (self.kind, self.a, self.b) if x)


class Driver:
    """Runs steps on one orchestrator; tokens make every payload unique."""

    def __init__(
        self,
        orch: Orchestrator,
        model: Model,
        tokens: itertools.count[int],
        *,
        provider: str = "scripted",
        restart: Callable[[], Awaitable[Orchestrator]] | None = None,
    ) -> None:
        self.orch = orch
        self.provider = provider
        self._restart = restart
        """A clean stop and a start on the same disk (the ``stop`` step; not in
        STEP_KINDS: only the machines and scenarios that ask for it run it)."""
        self.model = model
        self.tokens = tokens
        self._prompt_for: dict[str, str] = {}
        orch.subscribe(self._on_event)

    def _on_event(self, kind: str, payload: dict[str, Any]) -> None:
        if kind == "turn.started":
            agent_id = payload["agent_id"]
            prompt = self._prompt_for.pop(agent_id, None)
            args: dict[str, Any] = {"agent_id": agent_id}
            if prompt is not None:
                args["prompt"] = prompt
            self.model.begin("turn", **args)
        elif kind == "turn.completed":
            self.model.ack_turn(payload)
        elif kind == "turn.failed" and not payload.get("undecided"):
            # An undecided turn stays in flight: a crash may keep its commit record.
            self.model.fail(payload.get("error", "turn failed"))

    def _id(self, path: str) -> str | None:
        try:
            return self.orch.tree.resolve(path).agent_id
        except SubstratError:
            return None

    async def _turn(self, path: str, prompt: str) -> None:
        agent_id = self._id(path)
        if agent_id is None:
            return
        self._prompt_for[agent_id] = prompt
        try:
            await self.orch.run_turn(agent_id, prompt)
        except OutcomeUnknownError:
            raise  # undecided: the harness crashes and lets recovery decide
        except SubstratError as exc:
            self.model.fail(str(exc))
        finally:
            self._prompt_for.pop(agent_id, None)

    async def perform(self, step: Step) -> None:
        token = next(self.tokens)
        kind, a, b = step.kind, step.a, step.b
        if kind == "create_root":
            if self.orch.tree.name_taken(None, a):
                return
            self.model.begin(
                "create_root", name=a, instructions=f"root {a}", provider=self.provider
            )
            info = await self.orch.create_root(a, f"root {a}", provider=self.provider)
            self.model.ack_create_root(info.to_dict())
        elif kind == "spawn":
            await self._turn(a, f"@spawn {b} child {b} of {a}")
        elif kind in ("send", "ask"):
            await self._turn(a, f"@{kind} {b} m{token}")
        elif kind == "broadcast":
            await self._turn(a, f"@broadcast b{token}")
        elif kind == "inbox":
            await self._turn(a, "@inbox")
        elif kind == "complete":
            await self._turn(a, f"@complete r{token}")
        elif kind == "turn":
            await self._turn(a, f"plain turn {token}")
        elif kind == "terminate_by_parent":
            await self._turn(a, f"@terminate {b}")
        elif kind == "terminate":
            agent_id = self._id(a)
            if agent_id is None or self.orch.tree.get(agent_id).children:
                return
            self.model.begin("terminate", agent_id=agent_id)
            try:
                gone = await self.orch.terminate(agent_id)
            except OutcomeUnknownError:
                raise  # undecided: the harness crashes and lets recovery decide
            except SubstratError as exc:
                self.model.fail(str(exc))
                return
            self.model.ack_terminate(gone)
        elif kind == "evict":
            agent_id = self._id(a)
            if agent_id is None:
                return
            self.model.begin("evict", agent_id=agent_id)
            await self.orch.evict(agent_id)
            self.model.ack_noop()
        elif kind == "pending":
            await self.orch.run_pending(max_turns=MAX_WAKE_TURNS_PER_STEP)
        elif kind == "checkpoint":
            agent_id = self._id(a) if a else None
            if a and agent_id is None:
                return
            self.model.begin("checkpoint", agent_id=agent_id)
            await self.orch.checkpoint(agent_id)
            self.model.ack_noop()
        elif kind == "stop":
            # a clean stop writes the start summary, the start retires it before its
            # first write (see substrat.start_summary)
            if self._restart is None:
                return
            self.orch = await self._restart()
            self.orch.subscribe(self._on_event)
        elif kind == "user_inbox":
            ids = [m.message_id for m in self.orch.user_inbox()]
            if not ids:
                return
            self.model.begin("ack_user", message_ids=ids)
            self.orch.ack_user_messages(ids)
            self.model.ack_user(ids)
