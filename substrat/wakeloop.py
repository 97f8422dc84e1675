"""The daemon's wake loop, and how long an agent whose woken turns fail is left to rest.

The orchestrator wakes the idle agent holding the oldest pending message. An
agent whose turns keep failing (its endpoint is down, its key rejected) keeps
its messages, so without pacing it is the oldest forever: the loop would retry
it back to back and no other agent with pending messages would ever be woken.
Each failing agent therefore rests for a while that doubles with each failure
of its streak, up to :data:`WAKE_REST_MAX_S`, and the others are woken
meanwhile. One success ends the streak. The pacing lives in the daemon, not in
the orchestrator, whose wake order the crash fuzzers replay deterministically.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from substrat.errors import AgentBusyError, SubstratError

if TYPE_CHECKING:
    from substrat.orchestrator import Orchestrator

log = logging.getLogger("substrat.daemon")

WAKE_REST_FIRST_S = 0.1
"""How long an agent rests after the first failure of a streak."""
WAKE_REST_MAX_S = 300.0
"""The longest rest: a failing agent is retried at least this often (about 1 KB of log
each time), so an endpoint that comes back is used within five minutes."""
ROLL_FORWARD_RETRY_S = 5.0
"""How often effects that a committed operation failed to apply are tried again."""


class WakePacer:
    """Which failing agents rest, and until when (monotonic seconds)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._rest_s: dict[str, float] = {}
        self._until: dict[str, float] = {}

    def failed(self, agent_id: str) -> float:
        """One more failure of ``agent_id``'s streak; returns how long it now rests."""
        previous = self._rest_s.get(agent_id)
        rest = WAKE_REST_FIRST_S if previous is None else min(WAKE_REST_MAX_S, previous * 2)
        assert WAKE_REST_FIRST_S <= rest <= WAKE_REST_MAX_S
        self._rest_s[agent_id] = rest
        self._until[agent_id] = self._clock() + rest
        return rest

    def succeeded(self, agent_id: str) -> None:
        """A turn of ``agent_id`` succeeded: its streak ends."""
        self._rest_s.pop(agent_id, None)
        self._until.pop(agent_id, None)

    def resting(self) -> frozenset[str]:
        """The agents not to wake now."""
        now = self._clock()
        return frozenset(agent for agent, until in self._until.items() if until > now)

    def next_wake_in(self) -> float | None:
        """Seconds until the first resting agent may be woken again (None: none rests)."""
        now = self._clock()
        # a rest that is over needs no waiting: that agent is woken with the others, and
        # one that has nothing pending any more must not make the loop spin
        ahead = [until - now for until in self._until.values() if until > now]
        return min(ahead) if ahead else None


async def wake_loop(
    orch: Orchestrator, wake: asyncio.Event, stop: asyncio.Event, pacer: WakePacer
) -> None:
    """Run agents with pending messages, one turn at a time, until none are left; then
    wait for ``wake`` (or a resting agent's turn), until ``stop`` is set."""
    while not stop.is_set():
        timeout = pacer.next_wake_in()
        if orch.unapplied or orch.unfinished:
            # a committed turn's effects (or a creation's, a termination's later steps)
            # failed to apply: try again now and then, as a restart's recovery would,
            # until the disk takes them
            timeout = (
                ROLL_FORWARD_RETRY_S if timeout is None else min(timeout, ROLL_FORWARD_RETRY_S)
            )
        if timeout is None:
            await wake.wait()
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout)
        if orch.unapplied or orch.unfinished:
            orch.roll_forward()
        wake.clear()
        while not stop.is_set():
            resting = pacer.resting()
            node = orch.next_to_wake(skip=resting)
            if node is None:
                break
            failed = True
            try:
                # no await between choosing and running: the same agent is run
                await orch.run_pending(max_turns=1, skip=resting)
                failed = node.agent_id in orch.failing_wakes
            except AgentBusyError:
                break  # the agent is in a user's turn; its completion wakes us again
            except SubstratError as exc:
                log.warning("wake turn refused: %s", exc)
            except Exception:
                log.exception("wake turn failed")
            if failed:
                pacer.failed(node.agent_id)
            else:
                pacer.succeeded(node.agent_id)
