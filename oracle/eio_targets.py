"""Where the crash fuzzer's targeted EIO rule makes fsyncs fail: the ones that matter.

The generic EIO rule fails the n-th fsync of a random operation, n up to 24, so
it seldom draws the one fsync that decides an operation: the acknowledge of the
user's inbox is the first and only fsync of a ``user_inbox`` step, but one
draw in 24 of that rule names it, and only when the step drawn is that one and
the user has mail. A :class:`Target` names an operation, the steps that make it
meaningful first (a message for the user before the acknowledge, a message for
an agent before its ``@inbox`` turn, a child before its parent terminates it),
and the log whose fsyncs count (:func:`oracle.faults.failing_fsync`'s
``where``): a turn's first two fsyncs of its agent's log are its start and its
commit (``turn.complete``), an ``@inbox`` turn's commit comes later (the reads
and the claim before it), a leaf's termination writes its log first, and a
message's delivery writes its recipient's log after the sender's commit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from oracle.draws import pick
from oracle.workload import Step

USER_ENDPOINT = "user"

TARGET_KINDS = (
    "ack_user",
    "send",
    "delivery",
    "inbox",
    "terminate",
    "terminate_by_parent",
    "spawn",
)
"""What the targeted rule makes fail, in the order a shrink prefers."""


@dataclass(frozen=True)
class Target:
    """An operation, the steps before it, and the log whose fsyncs ``nth`` counts."""

    kind: str
    setup: tuple[Step, ...]
    step: Step
    log_of: str
    """An agent's path, or ``user`` for the user's log."""
    fsyncs: int
    """How many of that log's fsyncs the operation makes at least (``nth`` is drawn up
    to it): every one of them is a point where the operation's answer is decided."""


def draw_target(data: Any, paths: list[str], leaves: list[str], names: tuple[str, ...]) -> Target:
    """A :class:`Target` on the current tree (``paths`` not empty)."""
    kind = pick(data, TARGET_KINDS, "target")
    agent = pick(data, paths, "agent")
    if kind == "ack_user":
        return Target(kind, (Step("send", agent, USER_ENDPOINT),), Step("user_inbox"), "user", 1)
    if kind in ("send", "delivery", "inbox"):
        others = [p for p in paths if p != agent] or paths
        to = pick(data, [*others, USER_ENDPOINT] if kind != "inbox" else others, "to")
        if kind == "inbox":
            return Target(kind, (Step("send", agent, to),), Step("inbox", to), to, 4)
        send = Step(pick(data, ("send", "ask"), "send or ask"), agent, to)
        return Target(kind, (), send, agent, 2) if kind == "send" else Target(kind, (), send, to, 1)
    if kind == "terminate":
        leaf = pick(data, leaves, "leaf")
        return Target(kind, (), Step("terminate", leaf), leaf, 1)
    child = pick(data, names, "child")
    if kind == "terminate_by_parent":
        made = Step("spawn", agent, child)
        return Target(kind, (made,), Step("terminate_by_parent", agent, child), agent, 2)
    return Target(kind, (), Step("spawn", agent, child), agent, 2)
