"""The lifecycle fuzzer's conversation check, derived from what a log appended.

After every step the lifecycle machine checks each changed conversation: the
turns ``Orchestrator.history`` rebuilds from the agent's log must chain the
digest of every prompt, and their number must be the shadow's. Rebuilding the
whole conversation after each append decoded every entry of the log again,
three quarters of the machine's checks (docs/benchmarks.md, "Thirteenth pass:
the lifecycle fuzzer's own costs").

:class:`Conversations` keeps, per log directory, the active file's bytes and
the entries decoded from them. When the directory still holds the active file
alone and its old bytes are still its first bytes (one comparison, a
``memcmp``), only the appended lines are decoded (with substrat's own line
decoder, and only if every one is a healthy, known entry numbered after the
last), and substrat's ``ConversationBuilder``, which takes a log's entries
in batches, is fed the appended ones after those it was fed before: its turns
are ``conversation_from_entries`` of all the entries. A log met for the first
time is taken as grown from nothing: an agent's first check comes right after
its creation, when its log holds the creation's entries and no turn, where a
full read gave the read path nothing to get wrong that a later full read of the
same log does not also give it.
Anything else is rebuilt in full by ``Orchestrator.history`` (the read path
under test): a log whose old bytes changed (an entry rewritten in place, a line
cut or dropped from the middle), a new segment, base or start record, a
damaged or torn appended line; and besides, every ``full_every``-th lookup and
every lookup the caller forces (the teardown's, after the final restart), so
that a bug in the read path itself (the listing, the file read, the base) is
still met. A full rebuild of a log that could have grown in place is compared
with the incremental one, and a difference fails: the two derivations hold
each other to the same turns.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from substrat.conversation import ConversationBuilder
from substrat.events import KNOWN_EVENTS
from substrat.logline import Entry, decode_line
from substrat.providers.base import TurnRecord
from substrat.providers.scripted import chain_digest, reply_header

ACTIVE = "events.jsonl"
"""The active file, as :func:`oracle.incremental.log_part` names it."""
FULL_EVERY = 16
"""One lookup in this many rebuilds the conversation in full whatever changed."""


@dataclass
class _Held:
    files: dict[str, Any]
    count: int
    active: bytes | None
    """The active file's bytes, when the directory held it alone and it decoded whole."""
    entries: list[Entry]
    """What those bytes decode to (``read_log``'s entries); empty without ``active``."""
    digest: str = ""
    """The chain's digest after the ``count`` turns (checked up to there)."""
    built: ConversationBuilder | None = None
    """``entries`` fed to substrat's builder (its turns are the conversation of those
    bytes); None without ``active``, or when nothing was built yet (a new log)."""


_GROWN_FROM = _Held({}, 0, b"", [])
"""What a log met for the first time is taken to have grown from: no bytes, no turns."""


def decoded(data: bytes, start: int = 0, after_seq: int = 0) -> list[Entry] | None:
    """The entries of the whole lines in ``data[start:]``, as ``read_log`` gives them,
    or None unless every line is a healthy entry of a known event, numbered after
    ``after_seq`` and after the one before it, and the bytes end with a newline
    (a read of anything else reports damage, which only the full read may judge)."""
    if start == len(data):
        return []
    if not data.endswith(b"\n"):
        return None
    out: list[Entry] = []
    last = after_seq
    for line in data[start:-1].split(b"\n"):
        entry = decode_line(line)
        if isinstance(entry, str) or entry["seq"] <= last:
            return None
        if entry.get("event") not in KNOWN_EVENTS:
            return None
        last = entry["seq"]
        out.append(entry)
    return out


def chained(turns: list[TurnRecord], checked: int = 0, digest: str = "") -> str:
    """The chain's digest after ``turns``, after checking that each response from the
    ``checked``-th on answers its place in the chain of prompts (what the scripted
    provider's header says); ``digest``: the chain's after the first ``checked``."""
    for number, turn in enumerate(turns[checked:], start=checked + 1):
        digest = chain_digest(digest, turn.prompt)
        assert turn.response.startswith(reply_header(number, digest)), (number, turn.turn_id)
    return digest


class Conversations:
    """Per log directory: the number of chained turns, derived from what changed."""

    def __init__(self, full_every: int = FULL_EVERY) -> None:
        assert full_every >= 0
        self.full_every = full_every
        self._held: dict[str, _Held] = {}
        self.lookups = 0
        self.full = 0
        self.appended = 0

    def count(
        self,
        key: str,
        files: dict[str, Any],
        history: Callable[[], list[TurnRecord]],
        *,
        force_full: bool = False,
    ) -> int:
        """The chained turns of the log whose directory holds ``files`` (``log_part`` of
        its ``files_below``); ``history``: ``Orchestrator.history`` of its agent."""
        self.lookups += 1
        full = force_full or bool(self.full_every and self.lookups % self.full_every == 0)
        held = self._held.get(key)
        if held is not None and not full and held.files == files:
            return held.count  # the same bytes: the same conversation
        active = files.get(ACTIVE) if len(files) == 1 else None
        entries: list[Entry] | None = None
        new: list[Entry] | None = None
        if held is None:
            held = _GROWN_FROM  # a log met for the first time: all of it appended
        # the old bytes unchanged (one memcmp): the log only appended
        if active is not None and held.active is not None and active.startswith(held.active):
            last = held.entries[-1]["seq"] if held.entries else 0
            new = decoded(active, len(held.active), last)
            entries = None if new is None else held.entries + new
        checked, digest = 0, ""
        built: ConversationBuilder | None = None
        if entries is not None and not full:
            self.appended += 1
            # The builder of the old entries is fed the new ones only: it takes a log's
            # entries in batches, in file order (recovery feeds it so), and its turns are
            # then conversation_from_entries(entries), without going over the old ones again.
            built = held.built
            if built is None:
                built = ConversationBuilder()
                built.add_all(held.entries)
            built.add_all(new or [])
            turns = built.turns
            # the turns of the old entries are the old turns, already checked
            if len(turns) >= held.count:
                checked, digest = held.count, held.digest
        else:
            self.full += 1
            turns = history()
            if entries is None and active is not None:
                entries = decoded(active)
            if entries is not None:
                built = ConversationBuilder()
                built.add_all(entries)
            if built is not None and built.turns != turns:
                # a plain AssertionError: a check's failure (oracle._mutant_guard)
                raise AssertionError(
                    f"the conversation decoded from {key}'s bytes differs from what "
                    "Orchestrator.history rebuilds: one of the two readers is wrong"
                )
        digest = chained(turns, checked, digest)
        if entries is None:
            self._held[key] = _Held(files, len(turns), None, [], digest)
        else:
            self._held[key] = _Held(files, len(turns), active, entries, digest, built)
        return len(turns)
