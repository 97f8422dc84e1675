"""The wake loop: agents with pending messages get a turn to read them.

Deterministic by design (the crash fuzzers replay it): the idle agent holding
the oldest pending message goes first, one turn at a time, and the loop is
bounded. A woken agent's turn consumes everything in its inbox; its response
answers any request among them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from substrat import recovery
from substrat.agents import USER, AgentNode, AgentState, AgentTree, InboxRegistry, MessageEnvelope
from substrat.errors import ProviderError
from substrat.eventlog import Clock
from substrat.scheduler import ChunkSink
from substrat.tools import render_messages

if TYPE_CHECKING:
    from collections.abc import Callable, Collection

    from substrat.commit import TurnResult

MAX_WAKE_TURNS = 10_000


class WakeMixin:
    """The wake-loop half of :class:`~substrat.orchestrator.Orchestrator`."""

    tree: AgentTree
    inboxes: InboxRegistry
    turn_counts: dict[str, int]
    clock: Clock
    failing_wakes: set[str]
    """Agents whose woken turns fail and were reported: the streak's next failures are not."""

    if TYPE_CHECKING:
        new_id: Callable[[], str]

        async def _turn(
            self,
            node: AgentNode,
            prompt: str,
            consumed: list[MessageEnvelope],
            on_chunk: ChunkSink | None,
        ) -> TurnResult: ...

        def enqueue(self, message: MessageEnvelope) -> bool: ...

        def describe_endpoint(self, endpoint: str) -> str: ...

    def next_to_wake(self, skip: Collection[str] = ()) -> AgentNode | None:
        """The idle agent holding the oldest pending message, if any, passing over the
        agent ids in ``skip`` (the daemon's resting agents)."""
        best: tuple[int, AgentNode] | None = None
        for endpoint in self.inboxes.endpoints():
            if endpoint == USER or endpoint not in self.tree or endpoint in skip:
                continue
            node = self.tree.get(endpoint)
            if node.state in (AgentState.BUSY, AgentState.TERMINATED):
                continue
            order = self.inboxes.inbox(endpoint).oldest_pending_order()
            if order is not None and (best is None or order < best[0]):
                best = (order, node)
        return None if best is None else best[1]

    async def wake(self, node: AgentNode) -> TurnResult | None:
        """Run one turn of ``node`` on everything in its inbox."""
        inbox = self.inboxes.inbox(node.agent_id)
        messages = inbox.pending()
        if not messages:
            return None
        claim_id = f"wake-{self.turn_counts.get(node.agent_id, 0) + 1}"
        inbox.claim(claim_id)
        try:
            return await self._turn(node, render_messages(self, messages), messages, None)
        finally:
            inbox.release(claim_id)

    async def run_pending(self, *, max_turns: int = 100, skip: Collection[str] = ()) -> int:
        """Run agents that have pending messages until none do, or ``max_turns``; the
        agent ids in ``skip`` are not woken."""
        if not 0 <= max_turns <= MAX_WAKE_TURNS:
            raise ValueError(f"max_turns must be between 0 and {MAX_WAKE_TURNS}")
        turns = 0
        while turns < max_turns:
            node = self.next_to_wake(skip)
            if node is None:
                break
            try:
                await self.wake(node)
            except ProviderError as exc:
                if node.agent_id not in self.failing_wakes:
                    self.failing_wakes.add(node.agent_id)
                    self._report_failure(node, exc)
            else:
                self.failing_wakes.discard(node.agent_id)
            turns += 1
        return turns

    def _report_failure(self, node: AgentNode, exc: Exception) -> None:
        """A woken agent's turn failed: tell its parent (or the user), once per failing streak.

        The agent keeps its messages and is woken again (the daemon retries it after a
        rest that doubles with each failure): a report per retry would flood the inbox
        during an outage, and wake a parent agent for every one of them.
        """
        target = node.parent_id or USER
        self.enqueue(
            MessageEnvelope(
                message_id=self.new_id(),
                sender=node.agent_id,
                recipient=target,
                kind="error",
                payload=(
                    f"agent {self.tree.path(node.agent_id)} failed a turn: {exc}. Its messages "
                    "stay in its inbox and it is woken again; further failures are not "
                    "reported until one of its turns succeeds"
                ),
                timestamp=self.clock(),
            )
        )

    async def resume_roots(self) -> list[TurnResult]:
        """Give every root agent that lost a turn in a crash a turn to pick up again."""
        results = []
        for node in self.tree.roots():
            if node.lost_turn is not None and node.state is not AgentState.BUSY:
                results.append(await self._turn(node, recovery.RESUME_PROMPT, [], None))
        return results
