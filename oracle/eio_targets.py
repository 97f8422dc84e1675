"""Where the crash fuzzer's targeted EIO rule makes fsyncs fail: the ones that matter.

The generic EIO rule fails the n-th fsync of a random operation, n up to 24, so
it seldom draws the one fsync that decides an operation: the acknowledge of the
user's inbox is the only fsync of a ``user_inbox`` step, but one draw in 24 of
that rule names it, and only when the step drawn is that one and the user has
mail. A :class:`Target` names an operation, the steps that make it meaningful
first (a message for the user before the acknowledge, a message for an agent
before its ``@inbox`` turn, a child before its parent terminates it), and the
appends whose fsync may fail (:func:`oracle.faults.failing_fsync`'s ``where``
and ``entry``): a log and the event of the entry, the one that decides the
operation first (a turn's ``turn.complete``, its commit point; the user's
``message.delivered``; a leaf's ``agent.terminated``), then those around it (a
turn's ``turn.start``, and what is written after a commit: a message's
``message.enqueued`` in its recipient's log, the reader's ``message.delivered``,
a terminated child's ``agent.terminated``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from oracle.draws import pick
from oracle.workload import Step

USER_ENDPOINT = "user"

TARGET_KINDS = ("ack_user", "send", "inbox", "terminate", "terminate_by_parent", "spawn")
"""What the targeted rule makes fail, in the order a shrink prefers."""

COMMIT = "turn.complete"


@dataclass(frozen=True)
class Target:
    """An operation, the steps before it, and the appends whose fsync may fail."""

    kind: str
    setup: tuple[Step, ...]
    step: Step
    points: tuple[tuple[str, str], ...]
    """(whose log: an agent's path or ``user``, the entry's event), the one that
    decides the operation first (a draw favours it, and a shrink goes to it)."""


def draw_target(data: Any, paths: list[str], leaves: list[str], names: tuple[str, ...]) -> Target:
    """A :class:`Target` on the current tree (``paths`` not empty)."""
    kind = pick(data, TARGET_KINDS, "target")
    agent = pick(data, paths, "agent")
    if kind == "ack_user":
        setup = (Step("send", agent, USER_ENDPOINT),)
        return Target(kind, setup, Step("user_inbox"), ((USER_ENDPOINT, "message.delivered"),))
    if kind in ("send", "inbox"):
        others = [p for p in paths if p != agent]
        if kind == "inbox":
            if not others:  # an agent cannot message itself: a message from the user's side
                return _lone_inbox(agent)
            to = pick(data, others, "to")
            points = ((to, COMMIT), (to, "turn.start"), (to, "message.delivered"))
            return Target(kind, (Step("send", agent, to),), Step("inbox", to), points)
        to = pick(data, [*others, USER_ENDPOINT], "to")
        send = Step(pick(data, ("send", "ask"), "send or ask"), agent, to)
        points = ((agent, COMMIT), (agent, "turn.start"), (to, "message.enqueued"))
        return Target(kind, (), send, points)
    if kind == "terminate":
        leaf = pick(data, leaves, "leaf")
        return Target(kind, (), Step("terminate", leaf), ((leaf, "agent.terminated"),))
    child = pick(data, names, "child")
    if kind == "terminate_by_parent":
        points = ((agent, COMMIT), (agent, "turn.start"), (f"{agent}/{child}", "agent.terminated"))
        setup = (Step("spawn", agent, child),)
        return Target(kind, setup, Step("terminate_by_parent", agent, child), points)
    # (the child's own log does not exist before the step: its writes are not named)
    return Target(kind, (), Step("spawn", agent, child), ((agent, COMMIT), (agent, "turn.start")))


def _lone_inbox(agent: str) -> Target:
    """A lone agent's ``@inbox`` turn on an empty inbox: its commit still decides it."""
    return Target("inbox", (), Step("inbox", agent), ((agent, COMMIT), (agent, "turn.start")))
