"""What one agent's log says, distilled in a single read (recovery and its dry run use it).

:class:`AgentFacts` folds a log's healthy entries, in file order, into what
recovery needs: the creation, the termination, the messages enqueued and
delivered, the effects of committed turns, the turn lost in flight, and the
turn counter.

Turn ids (``t1``, ``t2``, ...) are never handed out twice. The counter is the
highest turn number named by any readable ``turn.start``, ``turn.complete`` or
``turn.failed``, so a damaged line of one turn never lowers it while another
line of that turn is readable. One case is left: a turn every line of which is
damaged, necessarily the newest (an agent runs one turn at a time, so all the
lines of turn *n* come after every line of turn *n - 1*). Each damaged line
after the last readable line that names a turn may be such a turn's start, so
the counter adds one per such line (:func:`turn_ceiling`): ids may skip after
damage, they never repeat.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from substrat import events
from substrat.agents import MessageEnvelope
from substrat.eventlog import DamageReport, Entry, decode_line, iter_log

TURN_EVENTS = frozenset({events.TURN_START, events.TURN_COMPLETE, events.TURN_FAILED})
_TURN_ID = re.compile(r"t([1-9][0-9]{0,17})")


def turn_number(turn_id: object) -> int | None:
    """The number of a turn id (``"t12"`` -> 12); None for anything else."""
    if not isinstance(turn_id, str):
        return None
    match = _TURN_ID.fullmatch(turn_id)
    return None if match is None else int(match.group(1))


def names_turn(entry: Entry) -> int | None:
    """The turn number an entry names, if it is a turn event with a well-formed id."""
    data = entry.get("data")
    if entry.get("event") not in TURN_EVENTS or type(data) is not dict:
        return None
    return turn_number(data.get("turn_id"))


def turn_ceiling(path: str | os.PathLike[str]) -> int:
    """The highest turn number the log at ``path`` may have handed out.

    The highest number any readable line names, plus one for each damaged
    complete line after the last readable line that names a turn (see the
    module docstring). A partial last line is not counted: it was never
    durable, so nothing it said was acknowledged.
    """
    highest = 0
    damaged_after = 0
    with open(path, "rb") as handle:
        for raw in handle:
            if not raw.endswith(b"\n"):
                break
            decoded = decode_line(raw[:-1])
            if isinstance(decoded, str):
                damaged_after += 1
                continue
            number = names_turn(decoded)
            if number is not None:
                highest = max(highest, number)
                damaged_after = 0
    return highest + damaged_after


@dataclass
class AgentFacts:
    """What one log says, distilled in a single pass."""

    session_id: str
    session_created: dict[str, Any] | None = None
    created: dict[str, Any] | None = None
    terminated: bool = False
    enqueued: dict[str, dict[str, Any]] = field(default_factory=dict)
    delivered: set[str] = field(default_factory=set)
    committed: list[dict[str, Any]] = field(default_factory=list)
    """The ``effects`` of every completed turn that spawned, sent or terminated
    something, in order (turns with none of these have nothing to roll forward;
    keeping only these keeps a long log's facts small)."""
    turn_counter: int = 0
    """The highest turn number the log names (see the module docstring;
    :meth:`count_damage` raises it for damaged lines after the last one)."""
    completed_turns: int = 0
    headless_turns: list[dict[str, Any]] = field(default_factory=list)
    """Committed turns whose ``turn.start`` is unreadable or missing: ``turn_id`` and
    whether ``turn.complete`` carries the prompt (logs written before it did lose it)."""
    last_complete_seq: int = 0
    last_complete: dict[str, Any] | None = None
    open_turns: dict[str, str] = field(default_factory=dict)
    """The turn started and neither completed nor failed (one turn at a time per
    agent, so at most the newest one)."""
    lost_notice: dict[str, Any] | None = None
    """A turn an earlier recovery closed as lost, not yet followed by a completed one:
    the agent has still to be told about it."""
    waiting: dict[str, str] = field(default_factory=dict)
    """Requests sent before the log's checkpoint with no reply in it (message id ->
    recipient); the requests sent after it are in ``committed``."""
    entries: int = 0
    damage: dict[str, int] = field(default_factory=dict)

    @property
    def lost_turn(self) -> dict[str, Any] | None:
        if not self.open_turns:
            return None
        turn_id, prompt = list(self.open_turns.items())[-1]
        return {"turn_id": turn_id, "prompt": prompt}

    def pending(self) -> list[dict[str, Any]]:
        return [m for i, m in self.enqueued.items() if i not in self.delivered]

    def received(self, message: dict[str, Any]) -> bool:
        """Whether this log ever received ``message`` (a ``message.enqueued`` for it)."""
        return message["message_id"] in self.enqueued

    def add_all(self, entries: Iterable[Entry]) -> None:
        for entry in entries:
            self.add(entry)

    def add(self, entry: Entry) -> None:
        """Fold one log entry (in file order) into the facts."""
        self.entries += 1
        event = entry.get("event")
        data = entry.get("data")
        if type(data) is not dict:
            return
        number = names_turn(entry)
        if number is not None:
            self.turn_counter = max(self.turn_counter, number)
        if event == events.TURN_START:
            turn_id = str(data.get("turn_id"))
            # a newer start means any older open turn was lost (and closed) before it
            self.open_turns = {turn_id: str(data.get("prompt", ""))}
        elif event == events.TURN_COMPLETE:
            turn_id = str(data.get("turn_id"))
            started_prompt = self._close_turns(turn_id, number)
            prompt = started_prompt if started_prompt is not None else data.get("prompt")
            if started_prompt is None:
                self.headless_turns.append({"turn_id": turn_id, "prompt_kept": "prompt" in data})
            effects = data.get("effects") or {}
            if effects.get("spawns") or effects.get("messages") or effects.get("terminations"):
                self.committed.append(effects)
            delivered = effects.get("delivered")
            if delivered:
                self.delivered.update(str(i) for i in delivered)
            self.completed_turns += 1
            self.lost_notice = None
            self.last_complete_seq = int(entry["seq"])
            self.last_complete = {
                "turn_id": turn_id,
                "prompt": str(prompt or ""),
                "response": data.get("response", ""),
            }
        elif event == events.MESSAGE_ENQUEUED:
            if MessageEnvelope.is_valid(data):
                self.enqueued[str(data["message_id"])] = data
            else:
                self.damage["unreadable_message"] = self.damage.get("unreadable_message", 0) + 1
        elif event == events.MESSAGE_DELIVERED:
            ids = data.get("message_ids") or [data.get("message_id")]
            self.delivered.update(str(i) for i in ids if i)
        elif event == events.TURN_FAILED and not data.get("reserved"):
            turn_id = str(data.get("turn_id"))
            prompt = self._close_turns(turn_id, number)
            if data.get("lost"):
                self.lost_notice = {"turn_id": turn_id, "prompt": str(data.get("prompt", prompt))}
        elif event == events.AGENT_CREATED:
            self.created = data
        elif event == events.SESSION_CREATED:
            self.session_created = data
        elif event == events.AGENT_TERMINATED:
            self.terminated = True

    def _close_turns(self, turn_id: str, number: int | None) -> str | None:
        """Close ``turn_id`` and every older open turn (their own end line may be damaged).

        Returns the prompt its ``turn.start`` had, None if that start was not read.
        """
        prompt = self.open_turns.pop(turn_id, None)
        if number is not None:
            for other in list(self.open_turns):
                older = turn_number(other)
                if older is not None and older < number:
                    del self.open_turns[other]
        return prompt

    def count_damage(self, path: str | os.PathLike[str], damage: DamageReport) -> None:
        """Raise the turn counter for damaged lines the log still holds (a second read,
        only for a damaged log: see :func:`turn_ceiling`)."""
        if any(item.kind != "torn_tail" for item in damage.items):
            self.turn_counter = max(self.turn_counter, turn_ceiling(path))


def collect_facts(session_id: str, entries: Iterable[Entry]) -> AgentFacts:
    facts = AgentFacts(session_id)
    for entry in entries:
        facts.add(entry)
    return facts


def read_facts(session_id: str, path: os.PathLike[str] | str) -> AgentFacts:
    """The facts of a log, read without repairing it (OSError if it cannot be read)."""
    damage = DamageReport()
    facts = collect_facts(session_id, iter_log(path, damage))
    facts.damage.update(damage.counts())
    if os.path.exists(path):
        facts.count_damage(path, damage)
    return facts
