"""A start's quiet agents: taken from the start summary in one pass, built when first used.

Most agents of a root restarted after a clean stop are *quiet*: the start summary
(:mod:`substrat.start_summary`) has an entry for each whose facts are a short row
(nothing pending, kept, waiting, open or damaged), and whose record says neither
ACTIVE nor TERMINATED. The scan of the records (:meth:`SessionStore.scan`) offers
each agent to :meth:`QuietAgents.vouch` before it reads its record: one pass makes
the one check the summary asks of an agent's files (its log's ``stat``:
:meth:`~substrat.start_summary.Summary.log_holds`, the check an agent the summary
holds but is not quiet passes too; its record and pending file are as the summary
says, see :mod:`substrat.start_summary`) and notes where its log ends. An agent
whose log does not hold is read as always (and its entry is then passed over, as
the report says).

Recovery's general passes (the reads, the orphans, the roll-forward plan) run over
the other agents only; a quiet agent joins them in the tree (:func:`recovery._build_tree`,
its node built from the row as from its facts) and in the counters the orchestrator
keeps. Its session record is built in the pass (what the orchestrator serves), its
facts (:class:`~substrat.facts.AgentFacts`) only when recovery needs them
(:class:`LiveFacts`: a message rolled forward to it) and otherwise never, its
checkpoint when the checkpointer first asks for it. What is built is what a start
without the summary builds, field by field (``tests/integration/test_start_lazy.py``).
An agent that recovery must treat otherwise (held back with an unreadable ancestor,
terminated in a cascade, or every checkpoint set aside) is *demoted*: its record
and facts join the general passes' maps, built as the summary has them.
"""

from __future__ import annotations

from typing import Any

from substrat.eventlog import any_suspect, is_suspect
from substrat.facts import AgentFacts
from substrat.logs import LogPool
from substrat.session import Session
from substrat.start_summary import Summary, facts_of, session_of

_QUIET_STATES = frozenset({"created", "suspended"})
"""A record in any other state is read as always: an ACTIVE one is made SUSPENDED on
disk, a TERMINATED one is no candidate at all."""


class QuietAgents:
    """The quiet agents of one start (see the module docstring)."""

    def __init__(self, summary: Summary | None, logs: LogPool) -> None:
        self._summary = summary
        self._logs = logs
        self.fields: dict[str, list[Any]] = {}
        """Session id -> its record's fields as the entry holds them (the record is
        built from them when first used: :func:`start_summary.session_of`)."""
        self.rows: dict[str, list[Any]] = {}
        """Session id -> the entry's facts row (see start_summary.quiet_row)."""
        self.unbuilt: dict[str, list[Any]] = {}
        """Agent id -> the row of each quiet agent added to the tree unbuilt."""
        self._ends: dict[str, tuple[int, int]] = {}
        """Session id -> where its log ends and its newest checkpoint's seq, handed to the
        log pool in one piece (:meth:`finish`)."""

    def vouch(self, sid: str) -> bool:
        """Take the agent whole if its summary entry is quiet and holds (see the module
        docstring); False leaves it to the general path, which checks it again.

        The checks of :func:`~substrat.start_summary.quiet_row`, of the record's fields
        (what :func:`~substrat.start_summary.session_of` builds a record of) and of
        :meth:`~substrat.start_summary.Summary.log_holds`, inline: asked of every quiet
        agent of a start, where three calls and a fingerprint's list were a third of
        this pass's Python."""
        summary = self._summary
        assert summary is not None, "no start summary to vouch for an agent"
        entry = summary.agents.get(sid)
        if entry is None:
            return False
        try:
            fields = entry[0]
            row = entry[2]
            checkpoint = summary.store.rows.get(sid)  # the newest, as log_holds takes it
            if not (
                fields[2] in _QUIET_STATES
                and type(row) is list  # quiet_row
                and len(row) == 5
                and type(row[0]) is dict
                and type(row[1]) is type(row[2]) is type(row[3]) is type(row[4]) is int
                and type(fields) is list  # session_fields
                and len(fields) == 7
                and type(fields[0]) is type(fields[1]) is type(fields[3]) is str
                and type(fields[4]) is int
                and (fields[6] is None or type(fields[6]) is dict)
                and type(checkpoint) is list  # log_holds: what a Checkpoint is built of
                and len(checkpoint) >= 9
                and checkpoint[1] == 1  # its file_first
            ):
                return False
            st = summary.log_stat(sid)
            fingerprint = entry[1]
            if (  # the log is as the entry says (see Summary.log_holds)
                type(fingerprint) is not list
                or st.st_size != fingerprint[2]
                or st.st_ino != fingerprint[1]
                or st.st_mtime_ns != fingerprint[3]
                or st.st_ctime_ns != fingerprint[4]
                or st.st_dev != fingerprint[0]
                or len(fingerprint) != 5
                or (any_suspect() and is_suspect(self._logs.path_text(sid)))
            ):
                return False
        except (OSError, ValueError, TypeError, IndexError, KeyError):
            return False  # the general path checks it again and says what is wrong
        del summary.agents[sid]  # used: what it holds goes with it
        self.fields[sid] = fields
        self.rows[sid] = row
        self._ends[sid] = (st.st_size, checkpoint[0])
        return True

    def finish(self) -> None:
        """Hand the log pool where every quiet agent's log ends (after the pass)."""
        self._logs.remember_summarized_all(self._ends)
        self._ends = {}

    def __contains__(self, sid: object) -> bool:
        return sid in self.rows

    def __len__(self) -> int:
        return len(self.rows)

    def session(self, sid: str) -> Session:
        """The agent's record, built (what a start without the summary reads)."""
        return session_of(sid, self.fields[sid])

    def created(self, sid: str) -> dict[str, Any]:
        created: dict[str, Any] = self.rows[sid][0]
        return created

    def demote(self, sid: str) -> tuple[Session, AgentFacts]:
        """The agent leaves the quiet ones: its record and its facts, built."""
        return session_of(sid, self.fields.pop(sid)), facts_of(sid, self.rows.pop(sid))


class LiveFacts(dict[str, AgentFacts]):
    """Session id -> facts of every agent in the tree; a quiet agent's are built from its
    row when first asked for by key (:meth:`dict.items` and :meth:`dict.get` see only
    those built: no quiet agent has anything to plan, see rollforward.plan's busy set).
    """

    def __init__(self, built: dict[str, AgentFacts], quiet: dict[str, list[Any]]) -> None:
        super().__init__(built)
        self._quiet = quiet

    def __missing__(self, sid: str) -> AgentFacts:
        facts = self[sid] = facts_of(sid, self._quiet[sid])
        return facts

    def counters(self, sid: str) -> tuple[int, int]:
        """The agent's turn counter and last completed seq, without building its facts."""
        facts = dict.get(self, sid)
        if facts is not None:
            return facts.turn_counter, facts.last_complete_seq
        row = self._quiet[sid]
        # as AgentFacts.turn_counter has it: highest_turn + damaged_after
        return row[1] + row[2], row[4]
