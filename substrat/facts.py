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

import operator
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from substrat import events
from substrat.agents import USER, MessageEnvelope
from substrat.eventlog import DamageReport, Entry, decode_line, iter_log
from substrat.logread import SEQ_GAP
from substrat.segments import Position, raw_lines

_V = TypeVar("_V")
_new = object.__new__
TURN_EVENTS = frozenset({events.TURN_START, events.TURN_COMPLETE, events.TURN_FAILED})
_TURN_ID = re.compile(r"t([1-9][0-9]{0,17})")
SUMMARY_CHARS = 1000
"""The last completed turn's prompt and response are kept to this many characters
(they are shown by ``recover --dry-run``; the log has them in full)."""


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


@dataclass
class TurnCeiling:
    """The turn-counter rule over raw lines, fed in file order (see the module docstring).

    ``highest`` is the highest number a readable line names; ``damaged_after``
    counts the damaged complete lines after the last readable line that names a
    turn. A partial last line is not counted: it was never durable, so nothing
    it said was acknowledged.
    """

    highest: int = 0
    damaged_after: int = 0

    def feed(self, raw: bytes) -> bool:
        """Take one line (with its newline); False at a partial line (stop there)."""
        if not raw.endswith(b"\n"):
            return False
        decoded = decode_line(raw[:-1])
        if isinstance(decoded, str):
            self.damaged_after += 1
            return True
        number = names_turn(decoded)
        if number is not None:
            self.highest = max(self.highest, number)
            self.damaged_after = 0
        return True

    @property
    def value(self) -> int:
        return self.highest + self.damaged_after


def turn_ceiling(
    path: str | os.PathLike[str], start: Position | None = None, carried: TurnCeiling | None = None
) -> TurnCeiling:
    """The turn-counter rule over the log at ``path`` (all of its segments), from ``start``
    on, continuing ``carried`` (the rule's state at ``start``, kept by a checkpoint)."""
    ceiling = TurnCeiling() if carried is None else TurnCeiling(**carried.__dict__)
    for _, _, raw in raw_lines(path, start):
        if not ceiling.feed(raw):
            break
    return ceiling


@dataclass(slots=True)
class AgentFacts:
    """What one log says, distilled in a single pass (or from a checkpoint and the tail
    after it: see :mod:`substrat.checkpoints`)."""

    session_id: str
    session_created: dict[str, Any] | None = None
    created: dict[str, Any] | None = None
    terminated: bool = False
    enqueued: dict[str, dict[str, Any]] = field(default_factory=dict)
    delivered: set[str] = field(default_factory=set)
    kept: dict[str, list[Any]] = field(default_factory=dict)
    """Delivered messages a checkpoint forgot the body of but not the id (message id ->
    [sender, turn number]): their sender may still roll them forward (see :meth:`forget`)."""
    settled_senders: dict[str, int] = field(default_factory=dict)
    """Sender agent id -> a turn number up to which every message that sender's turns
    sent here is in this log (its delivered ones forgotten by a checkpoint)."""
    committed: list[dict[str, Any]] = field(default_factory=list)
    """The ``effects`` of every completed turn that spawned, sent or terminated
    something, in order (turns with none of these have nothing to roll forward;
    keeping only these keeps a long log's facts small). After a checkpoint only the
    turns after it, and the spawns of live children before it (``children``)."""
    children: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Session id -> spawn record of each child spawned before the checkpoint and
    alive when it was written."""
    highest_turn: int = 0
    damaged_after: int = 0
    """Damaged lines after the last readable line that names a turn (see
    :class:`TurnCeiling`; set by :meth:`count_damage` and by checkpoints)."""
    completed_turns: int = 0
    headless_turns: list[dict[str, Any]] = field(default_factory=list)
    """Committed turns whose ``turn.start`` is unreadable or missing: ``turn_id`` and
    whether ``turn.complete`` carries the prompt (logs written before it did lose it)."""
    last_complete_seq: int = 0
    last_complete: dict[str, Any] | None = None
    """The last completed turn: ``turn_id``, ``prompt`` and ``response`` (each cut to
    ``SUMMARY_CHARS``)."""
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
    def turn_counter(self) -> int:
        """The highest turn number this log may have handed out (see the module docstring)."""
        return self.highest_turn + self.damaged_after

    def cut_turn_start(self, number: int) -> None:
        """The log's repair cut off a damaged last line that still showed the start of
        turn ``number`` (no pending copy was left to restore it: a power loss can take
        that copy). Nothing else may name the turn, so it is taken as started and lost
        in flight: recovery closes it durably, and its id is never handed out again."""
        if number > self.turn_counter:
            self.highest_turn = number
            self.damaged_after = 0
            self.open_turns = {f"t{number}": ""}

    @property
    def lost_turn_with_doubt(self) -> dict[str, Any] | None:
        """:attr:`lost_turn`, marked ``record_damaged`` when damaged lines follow its start:
        its ``turn.complete`` may be one of them, so it may have completed, its effects
        applied (a damaged line costs that line; what it said is not known)."""
        lost = self.lost_turn
        if lost is None or not self.damaged_after:
            return lost
        return {**lost, "record_damaged": True}

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
        message_id = message["message_id"]
        if message_id in self.enqueued or message_id in self.kept:
            return True
        turn = _sending_turn(message)
        return turn is not None and turn <= self.settled_senders.get(str(message["sender"]), 0)

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
            self.highest_turn = max(self.highest_turn, number)
            self.damaged_after = 0
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
                "prompt": str(prompt or "")[:SUMMARY_CHARS],
                "response": str(data.get("response", ""))[:SUMMARY_CHARS],
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
                if data.get("record_damaged"):  # closed as "outcome unknown": the agent is told so
                    self.lost_notice["record_damaged"] = True
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

    def count_damage(
        self,
        path: str | os.PathLike[str],
        damage: DamageReport,
        start: Position | None = None,
        carried: TurnCeiling | None = None,
    ) -> None:
        """Count the damaged lines the log still holds after ``start`` into the turn
        counter (a second read, only for a damaged log: see :class:`TurnCeiling`).

        ``carried`` is the rule's state at ``start`` (from a checkpoint). Entries
        missing whole (``seq_gap``) leave no line to count.
        """
        if any(item.kind not in ("torn_tail", "missing_segment", SEQ_GAP) for item in damage.items):
            ceiling = turn_ceiling(path, start, carried)
            self.highest_turn = max(self.highest_turn, ceiling.highest)
            self.damaged_after = ceiling.damaged_after

    def count_missing(
        self, path: str | os.PathLike[str], damage: DamageReport, start: Position | None = None
    ) -> None:
        """Count the entries missing whole from the log (``damage``'s gaps: segments or
        lines removed, an archive's damaged end, the segments before where the start
        record says the active file starts) into the turn counter, those after the last
        readable line that names a turn: each may have been a turn's start, and no later
        line names a higher turn to bound the counter. Ids may skip after damage; they
        never repeat. (A further read of the log from ``start``, only when entries are
        missing.)"""
        gaps = damage.gaps()
        if not gaps:
            return
        last = 0  # the seq of the last readable line naming a turn, after ``start``
        for _, _, raw in raw_lines(path, start):
            if not raw.endswith(b"\n"):
                continue  # a cut line (a damaged archive's end): nothing it names counts
            decoded = decode_line(raw[:-1])
            if not isinstance(decoded, str) and names_turn(decoded) is not None:
                last = int(decoded["seq"])
        self.damaged_after += sum(b - a + 1 for a, b in gaps if a > last)

    # -- checkpoints ------------------------------------------------------------

    def forget(self, settled: Mapping[str, int], *, strict: bool) -> None:
        """Drop what a checkpoint need not keep, once every committed turn here is settled.

        The caller vouches that the effects of every turn in ``committed`` are
        durably applied (children created, messages logged in their recipients'
        logs, terminations done), so none needs rolling forward. ``settled`` maps
        each live agent to the turn up to which all of its turns are settled
        likewise; an agent not in it is terminated, unless ``strict`` (some agent
        is held back, so its absence proves nothing).

        Kept: the pending messages (enqueued, not delivered), the requests still
        waiting for a reply, the spawn records of live children, and, for each
        delivered message whose sender may still roll it forward, its id. The
        bodies of delivered messages are dropped; ``settled_senders`` remembers
        up to which turn each sender's messages are all here, so :meth:`received`
        still answers for them.
        """
        replies = {m.get("reply_to") for m in self.enqueued.values() if m.get("kind") == "reply"}
        for effects in self.committed:
            for spawn in effects.get("spawns", []):
                self.children[str(spawn["session_id"])] = spawn
            gone = set(effects.get("terminations", []))
            self.children = {s: c for s, c in self.children.items() if c["agent_id"] not in gone}
            for data in effects.get("messages", []):
                if data.get("kind") == "request" and isinstance(data.get("recipient"), str):
                    self.waiting[str(data["message_id"])] = data["recipient"]
        self.committed = []
        self.waiting = {m: to for m, to in self.waiting.items() if m not in replies}

        def alive(agent_id: str) -> bool:
            return strict or agent_id == USER or agent_id in settled

        self.waiting = {m: to for m, to in self.waiting.items() if alive(to)}
        self.children = {s: c for s, c in self.children.items() if alive(str(c["agent_id"]))}
        for message_id in [m for m in self.enqueued if m in self.delivered]:
            data = self.enqueued.pop(message_id)
            self.kept[message_id] = [str(data.get("sender")), _sending_turn(data)]
        self.delivered = set()
        for message_id, (sender, turn) in list(self.kept.items()):
            if sender in settled:
                if turn is not None and turn <= settled[sender]:
                    del self.kept[message_id]
                    self.settled_senders[sender] = settled[sender]
            elif not strict:
                del self.kept[message_id]  # a terminated sender rolls nothing forward
        for sender in list(self.settled_senders):
            if sender in settled:
                self.settled_senders[sender] = max(self.settled_senders[sender], settled[sender])
            elif not strict:
                del self.settled_senders[sender]

    def to_dict(self) -> dict[str, Any]:
        """The facts as plain JSON (what a checkpoint stores); see :meth:`from_dict`."""
        assert not self.committed and not self.delivered, "forget() before storing"
        return {
            "session_created": self.session_created,
            "created": self.created,
            "terminated": self.terminated,
            "pending": list(self.enqueued.values()),
            "kept": self.kept,
            "settled_senders": self.settled_senders,
            "children": self.children,
            "waiting": self.waiting,
            "highest_turn": self.highest_turn,
            "damaged_after": self.damaged_after,
            "completed_turns": self.completed_turns,
            "headless_turns": self.headless_turns,
            "last_complete_seq": self.last_complete_seq,
            "last_complete": self.last_complete,
            "open_turns": self.open_turns,
            "lost_notice": self.lost_notice,
            "damage": self.damage,
        }

    @classmethod
    def quiet(
        cls,
        session_id: str,
        created: dict[str, Any],
        highest_turn: int,
        damaged_after: int,
        completed_turns: int,
        last_complete_seq: int,
    ) -> AgentFacts:
        """``cls(session_id, created=created, highest_turn=..., ...)``, every other field
        as its default: the facts of a quiet agent of the start summary, built for each
        at a start. Field by field: the dataclass's ``__init__``, a keyword and a
        default factory per field, cost 2.3 us, this 1.9 (tests/unit/test_facts_quiet.py
        checks that the two agree on every field)."""
        facts = _new(cls)
        facts.session_id = session_id
        facts.session_created = None
        facts.created = created
        facts.terminated = False
        facts.enqueued = {}
        facts.delivered = set()
        facts.kept = {}
        facts.settled_senders = {}
        facts.committed = []
        facts.children = {}
        facts.highest_turn = highest_turn
        facts.damaged_after = damaged_after
        facts.completed_turns = completed_turns
        facts.headless_turns = []
        facts.last_complete_seq = last_complete_seq
        facts.last_complete = None
        facts.open_turns = {}
        facts.lost_notice = None
        facts.waiting = {}
        facts.entries = 0
        facts.damage = {}
        return facts

    @classmethod
    def from_dict(cls, session_id: str, data: dict[str, Any]) -> AgentFacts:
        """Facts stored by :meth:`to_dict`; ValueError if they do not read as such."""
        try:
            # An empty map (most of them, at most agents) is kept as decoded: a call per
            # field was a third of this, which a restart runs for every agent.
            pending, kept, settled_senders = data["pending"], data["kept"], data["settled_senders"]
            children, waiting, open_turns = data["children"], data["waiting"], data["open_turns"]
            damage = data["damage"]
            facts = cls(
                session_id,
                session_created=_dict_or_none(data["session_created"]),
                created=_dict_or_none(data["created"]),
                terminated=bool(data["terminated"]),
                enqueued={} if type(pending) is list and not pending else _keyed(pending),
                kept=kept if type(kept) is dict and not kept else _map(kept, _kept_entry),
                settled_senders=settled_senders
                if type(settled_senders) is dict and not settled_senders
                else _map(settled_senders, int),
                children=children
                if type(children) is dict and not children
                else _map(children, dict),
                waiting=waiting if type(waiting) is dict and not waiting else _map(waiting, str),
                highest_turn=int(data["highest_turn"]),
                damaged_after=int(data["damaged_after"]),
                completed_turns=int(data["completed_turns"]),
                headless_turns=list(data["headless_turns"]),
                last_complete_seq=int(data["last_complete_seq"]),
                last_complete=_dict_or_none(data["last_complete"]),
                open_turns=open_turns
                if type(open_turns) is dict and not open_turns
                else _map(open_turns, str),
                lost_notice=_dict_or_none(data["lost_notice"]),
                damage=damage if type(damage) is dict and not damage else _map(damage, int),
            )
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            raise ValueError(f"not the facts of a log: {exc!r}") from None
        if facts.enqueued and not MessageEnvelope.all_valid(list(facts.enqueued.values())):
            raise ValueError("a pending message is not a message envelope")
        if facts.children:
            facts.committed = [{"spawns": list(facts.children.values())}]
        return facts

    def ceiling(self) -> TurnCeiling:
        return TurnCeiling(self.highest_turn, self.damaged_after)


def _map(value: Any, convert: Callable[[Any], _V]) -> dict[str, _V]:
    """A stored object with string keys and ``convert``-ed values (TypeError, ValueError,
    AttributeError if it is not one); an empty one, the common case, without a copy."""
    if type(value) is dict and not value:
        return {}
    return {str(k): convert(v) for k, v in value.items()}


def _keyed(messages: Any) -> dict[str, dict[str, Any]]:
    # the user's thousands of unread messages at a restart: no Python loop
    return dict(zip(map(str, map(_MESSAGE_ID, messages)), messages, strict=True))


_MESSAGE_ID = operator.itemgetter("message_id")


def _kept_entry(value: Any) -> list[Any]:
    return [str(value[0]), value[1]]


def _dict_or_none(value: object) -> dict[str, Any] | None:
    if value is None:
        return None
    if type(value) is not dict:
        raise TypeError(f"expected an object, not {type(value).__name__}")
    return value


def _sending_turn(message: Mapping[str, Any]) -> int | None:
    metadata = message.get("metadata")
    return turn_number(metadata.get("turn_id")) if isinstance(metadata, dict) else None


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
