"""Looking agents up: by id, path or id prefix, live or terminated.

The query half of :class:`~substrat.orchestrator.Orchestrator`. Live agents
come from the tree; terminated ones from :class:`~substrat.terminated.Graveyard`
(their logs are kept). Operations that act (send, terminate) take live agents
only and say "agent X was terminated at T" for a terminated one; reading
(``show``, ``history``, ``list --all``) takes either.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from substrat.agent_refs import ambiguous, did_you_mean, id_prefix_matches, too_short_note
from substrat.agents import (
    USER,
    AgentNode,
    AgentState,
    AgentTree,
    InboxRegistry,
)
from substrat.conversation import conversation_from_log, history_of_log
from substrat.errors import AgentNotFoundError, AgentTerminatedError
from substrat.logs import LogPool
from substrat.providers.base import TurnRecord
from substrat.terminated import Graveyard, TerminatedAgent, read_instructions
from substrat.words import when

if TYPE_CHECKING:
    from substrat.access import Unreadable
    from substrat.multiplexer import Multiplexer
    from substrat.recovery_report import RecoveryReport

LIST_HINT = "`substrat agent list --all` shows every agent"


@dataclass
class AgentInfo:
    agent_id: str
    session_id: str
    name: str
    parent_id: str | None
    path: str
    state: AgentState
    provider: str
    model: str
    instructions: str
    children: list[str]
    pending_messages: int
    terminated_at: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "agent_id": self.agent_id,
            "session_id": self.session_id,
            "name": self.name,
            "parent_id": self.parent_id,
            "path": self.path,
            "state": self.state.value,
            "provider": self.provider,
            "model": self.model,
            "instructions": self.instructions,
            "children": list(self.children),
            "pending_messages": self.pending_messages,
            "terminated_at": self.terminated_at,
        }


class QueryMixin:
    """Agent lookups and read-only views (see the module docstring)."""

    tree: AgentTree
    inboxes: InboxRegistry
    recovery_report: RecoveryReport | None
    logs: LogPool
    graveyard: Graveyard
    mux: Multiplexer

    if TYPE_CHECKING:

        def check_finished(self, node: AgentNode | None, *, turn: bool) -> None: ...

    # -- resolving references ---------------------------------------------------

    def resolve_live(self, ref: str) -> AgentNode:
        """A live agent by id, path or unique id prefix; a terminated one is refused."""
        self.check_finished(None, turn=False)  # a termination cut after its commit first
        node = self.tree.find(ref)
        if node is not None:
            self.check_finished(node, turn=False)
            return node
        dead = self._find_terminated(ref)
        if dead is not None:
            path = self._terminated_path(dead)
            raise AgentTerminatedError(
                f"agent {path} was terminated at {when(dead.terminated_at)}; its log is kept"
            ).with_details(agent=path, agent_id=dead.agent_id, terminated_at=dead.terminated_at)
        raise self._not_found(ref)

    def _find_terminated(self, ref: str) -> TerminatedAgent | None:
        exact = self.graveyard.get(ref)
        if exact is not None:
            return exact
        dead = self.graveyard.all()
        by_path = [a for a in dead if self._terminated_path(a) == ref.strip("/")]
        if len(by_path) > 1:
            raise ambiguous(
                ref,
                {a.agent_id: self._terminated_path(a) for a in by_path},
                f"{len(by_path)} terminated agents were named {ref.strip('/')}",
            )
        if by_path:
            return by_path[0]
        matches = id_prefix_matches(ref, [a.agent_id for a in dead])
        if len(matches) > 1:
            raise ambiguous(ref, {m: self._terminated_path(self.graveyard.get(m)) for m in matches})
        return self.graveyard.get(matches[0]) if matches else None

    def _not_found(self, ref: str) -> AgentNotFoundError:
        held = self._held_back(ref)
        if held is not None:  # not gone: its files could not be used at the start
            return AgentNotFoundError(
                f"agent {ref} is held back since the daemon started ({held.error}): "
                f"{held.what_to_do}"
            ).with_details(held=held.to_dict())
        known = self.tree.paths() + [self._terminated_path(a) for a in self.graveyard.all()]
        suggestion = did_you_mean(ref, known)  # "; did you mean X?", or ""
        joint = " " if suggestion else "; "
        short = too_short_note(ref)
        return AgentNotFoundError(f"no agent {ref}{short}{suggestion}{joint}{LIST_HINT}")

    def _held_back(self, ref: str) -> Unreadable | None:
        """The agent the start held back (see substrat.access) that ``ref`` names: by its
        name (a root's, which the registry knows) or its session id (or a prefix)."""
        report = self.recovery_report
        if report is None or not ref:
            return None
        for item in report.unreadable:
            if ref.strip("/") == item.name or (len(ref) >= 4 and item.session_id.startswith(ref)):
                return item
        return None

    def _terminated_path(self, agent: TerminatedAgent | None) -> str:
        assert agent is not None

        def live_path(session_id: str) -> str | None:
            node = self.tree.by_session(session_id)
            return None if node is None else self.tree.path(node.agent_id)

        return self.graveyard.path(agent, live_path)

    # -- views ----------------------------------------------------------------------

    def _info(self, node: AgentNode, path: str | None = None) -> AgentInfo:
        """``path``: the agent's path, if the caller knows it (see :meth:`agents`)."""
        return AgentInfo(
            agent_id=node.agent_id,
            session_id=node.session_id,
            name=node.name,
            parent_id=node.parent_id,
            path=self.tree.path(node.agent_id) if path is None else path,
            state=node.state,
            provider=node.provider,
            model=node.model,
            instructions=node.instructions,
            children=[c.agent_id for c in self.tree.children(node.agent_id)],
            pending_messages=len(self.inboxes.inbox(node.agent_id)),
        )

    def _dead_info(self, dead: TerminatedAgent, *, instructions: bool = False) -> AgentInfo:
        parent = None
        if dead.parent_session_id is not None:
            node = self.tree.by_session(dead.parent_session_id)
            parent = node.agent_id if node is not None else None
        return AgentInfo(
            agent_id=dead.agent_id,
            session_id=dead.session_id,
            name=dead.name,
            parent_id=parent,
            path=self._terminated_path(dead),
            state=AgentState.TERMINATED,
            provider=dead.provider,
            model=dead.model,
            instructions=read_instructions(self.logs.path(dead.session_id)) if instructions else "",
            children=[],
            pending_messages=0,
            terminated_at=dead.terminated_at,
        )

    def get(self, agent: str) -> AgentInfo:
        """A live agent's info (AgentTerminatedError for a terminated one)."""
        return self._info(self.resolve_live(agent))

    def lookup(self, agent: str) -> AgentInfo:
        """Any agent's info, live or terminated."""
        node = self.tree.find(agent)
        if node is not None:
            return self._info(node)
        dead = self._find_terminated(agent)
        if dead is None:
            raise self._not_found(agent)
        return self._dead_info(dead, instructions=True)

    def agents(self, *, include_terminated: bool = False) -> list[AgentInfo]:
        """Live agents, parents before children; then, if asked, the terminated ones."""
        # The walk gives parents before children: each path is its parent's and a name,
        # not a climb to the root per agent (the lifecycle fuzzer lists after every step).
        paths: dict[str, str] = {}
        live = []
        for node in self.tree.walk():
            parent = node.parent_id
            if parent is None:
                path = node.name
            elif parent in paths:
                path = f"{paths[parent]}/{node.name}"
            else:  # not met before its child: asked of the tree, as for one agent
                path = self.tree.path(node.agent_id)
            paths[node.agent_id] = path
            live.append(self._info(node, path))
        if not include_terminated:
            return live
        return live + [self._dead_info(a) for a in self.graveyard.all()]

    def tree_view(self) -> list[dict[str, Any]]:
        def branch(node: AgentNode) -> dict[str, Any]:
            return {
                "agent": self._info(node).to_dict(),
                "children": [branch(c) for c in self.tree.children(node.agent_id)],
            }

        return [branch(root) for root in self.tree.roots()]

    def inspect(self, agent: str, *, recent_turns: int = 5) -> dict[str, Any]:
        """Everything about an agent (a terminated one too: from its log)."""
        info = self.lookup(agent)
        history = conversation_from_log(self.logs.path(info.session_id))
        node = self.tree.find(info.agent_id)
        return {
            "agent": info.to_dict(),
            "inbox": []
            if node is None
            else [m.to_dict() for m in self.inboxes.inbox(node.agent_id).all()],
            "turns": len(history),
            "recent_turns": [
                {"turn_id": t.turn_id, "prompt": t.prompt, "response": t.response}
                for t in history[-recent_turns:]
            ],
            "lost_turn": None if node is None else node.lost_turn,
            "waiting_on": {} if node is None else dict(node.waiting_on),
            "live": node is not None and self.mux.is_live(node.agent_id),
        }

    def history(self, agent: str) -> list[TurnRecord]:
        """The agent's conversation, rebuilt from its log (completed turns only)."""
        return conversation_from_log(self.logs.path(self.lookup(agent).session_id))

    def history_and_gaps(self, agent: str) -> tuple[list[TurnRecord], list[tuple[int, int]], int]:
        """:meth:`history`, the ranges of log entries it is missing (lost to damage), and
        through which entry the compaction policy deleted the log (0: none)."""
        return history_of_log(self.logs.path(self.lookup(agent).session_id))

    def describe_endpoint(self, endpoint: str) -> str:
        if endpoint == USER:
            return USER
        if endpoint in self.tree:
            return self.tree.path(endpoint)
        return endpoint
