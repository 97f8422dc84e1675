"""What a failed check lost of the acknowledged state: agents, turns and messages, by name.

The checks (:func:`oracle.checks.check_recovery`, :func:`oracle.daemon_driver.check_served`)
say *that* a recovered or served state differs from the model and show the
difference; a campaign's report also has to say *how much* was lost, and of
what. :func:`lost_between` counts it: an acknowledged agent that is gone (with
its turns and its inbox), an acknowledged turn that is gone or replaced, an
acknowledged message no longer in its inbox. What is there but should not be
(an invented agent, an unacknowledged message) is not a loss; the check's own
message reports it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from substrat.agents import USER

SHOWN = 3
"""Names listed per kind in a summary; the rest are counted."""


class Picture(Protocol):
    """Agents, conversations and inboxes: an expected or an observed state.

    :class:`oracle.checks.View` (with transcripts) and
    :class:`oracle.daemon_driver.Served` (prompt and response only) both fit.
    """

    @property
    def agents(self) -> Mapping[str, tuple[str, str | None, str]]: ...

    @property
    def turns(self) -> Mapping[str, Sequence[tuple[Any, ...]]]: ...

    @property
    def inboxes(self) -> Mapping[str, set[str]]: ...


@dataclass
class Lost:
    """Acknowledged things a check found gone, one readable label each."""

    agents: list[str] = field(default_factory=list)
    turns: list[str] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)
    other: list[str] = field(default_factory=list)
    """Losses seen without the state to itemize them (an answer that contradicts the
    acknowledged history, a root that could not be read back)."""

    @property
    def count(self) -> int:
        return len(self.agents) + len(self.turns) + len(self.messages) + len(self.other)

    def add(self, more: Lost) -> None:
        self.agents += more.agents
        self.turns += more.turns
        self.messages += more.messages
        self.other += more.other

    def to_dict(self) -> dict[str, list[str]]:
        return {
            "agents": list(self.agents),
            "turns": list(self.turns),
            "messages": list(self.messages),
            "other": list(self.other),
        }

    def summary(self, shown: int = SHOWN) -> str:
        """``"13 agents (lead (1a2b3c4d), ...), 40 turns, 2 messages"``, or ``"nothing"``."""
        parts = []
        for kind, labels in (
            ("agent", self.agents),
            ("turn", self.turns),
            ("message", self.messages),
            ("other loss", self.other),
        ):
            if not labels:
                continue
            listed = "; ".join(labels[:shown])
            more = f"; and {len(labels) - shown} more" if len(labels) > shown else ""
            parts.append(f"{len(labels)} {kind}{'' if len(labels) == 1 else 's'} ({listed}{more})")
        return ", ".join(parts) or "nothing"


def lost_between(want: Picture, got: Picture) -> Lost:
    """What of ``want`` (the acknowledged state) is missing from ``got``."""
    lost = Lost()

    def label(agent_id: str) -> str:
        if agent_id == USER:
            return USER
        known = want.agents.get(agent_id) or got.agents.get(agent_id)
        return f"{known[0] if known else '?'} ({agent_id[:8]})"

    def turns(agent_id: str, start: int) -> None:
        for number, turn in enumerate(want.turns.get(agent_id, ())[start:], start + 1):
            prompt = str(turn[0]).replace("\n", " ")
            cut = prompt if len(prompt) <= 40 else prompt[:39] + "…"
            lost.turns.append(f"{label(agent_id)} turn {number}: {cut!r}")

    def messages(endpoint: str, ids: set[str]) -> None:
        lost.messages += [f"{mid} in the inbox of {label(endpoint)}" for mid in sorted(ids)]

    for agent_id in sorted(want.agents):
        if agent_id not in got.agents:
            lost.agents.append(label(agent_id))
            turns(agent_id, 0)
            messages(agent_id, set(want.inboxes.get(agent_id, set())))
            continue
        w, g = want.turns.get(agent_id, ()), got.turns.get(agent_id, ())
        same = next((i for i, (a, b) in enumerate(zip(w, g, strict=False)) if a != b), None)
        turns(agent_id, min(len(w), len(g)) if same is None else same)
    for endpoint, ids in sorted(want.inboxes.items()):
        if endpoint == USER or endpoint in got.agents:
            messages(endpoint, ids - got.inboxes.get(endpoint, set()))
    return lost
