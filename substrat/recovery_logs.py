"""Recovery's read of one log: from its newest checkpoint that holds, then the rest, repaired.

Every endpoint (an agent, or the user) is read once at start-up. With a checkpoint
that holds against its log (:func:`~substrat.checkpoints.verify`), only what
follows it is read; a log that ends where its checkpoint does is not opened at
all. Without one, the whole log is repaired (a torn tail cut, a pending entry
replayed) and distilled into :class:`~substrat.facts.AgentFacts` in the same
single read. A log whose first segments were removed by hand (segment names, or
with none left its start record, say where it should start), with no checkpoint
to say what they held, is :class:`HistoryGone`. What the reads find goes into the
:class:`~substrat.recovery_report.RecoveryReport`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from substrat import access
from substrat.access import Unreadable
from substrat.agents import USER
from substrat.checkpoints import Checkpoint, StoreRead, line_mismatch, verify
from substrat.conversation import ConversationBuilder
from substrat.eventlog import (
    PENDING_NAME,
    DamageReport,
    Entry,
    Resume,
    Sink,
    is_suspect,
    repair_log,
)
from substrat.events import KNOWN_EVENTS
from substrat.facts import AgentFacts
from substrat.logbase import BASE_NAME, base_candidates
from substrat.logread import sealed_batches
from substrat.logs import LogPool
from substrat.recovery_report import RecoveryReport
from substrat.registry import RootRegistry
from substrat.segments import (
    START_NAME,
    Position,
    Segment,
    active_start,
    list_log,
    list_sealed,
    missing_before_active,
)
from substrat.session import SessionStore
from substrat.start_summary import Summary, facts_of

THEN = "restart the daemon"
"""The step after fixing an unreadable agent (see substrat.access)."""


@dataclass
class RootStores:
    """The stores of one root that recovery reads and repairs."""

    store: SessionStore
    logs: LogPool
    roots: RootRegistry
    checkpoints: StoreRead
    used: dict[str, Checkpoint] = field(default_factory=dict)
    cut_turn_starts: dict[str, int] = field(default_factory=dict)
    """Endpoint -> the turn whose damaged start its repair cut off (a read after that
    repair no longer sees the line: see :meth:`AgentFacts.cut_turn_start`)."""
    summary: Summary | None = None
    """The start summary, if it held as a whole (:mod:`substrat.start_summary`)."""
    summarized: list[str] = field(default_factory=list)
    """Endpoints whose facts came from the start summary: the checkpoint each used is
    its newest in ``checkpoints``, built when first asked for (see
    :meth:`~substrat.checkpointer.Checkpointer.adopt`), not at start."""


def read_agent(
    root: RootStores, sid: str, report: RecoveryReport, *, recorded: bool = False
) -> AgentFacts | Unreadable | None:
    """Repair one agent's log and distill it; None if it has no log, Unreadable if it failed.

    ``recorded``: its record was read (then its facts may come from the start summary,
    which leaves out ``session.created``: only a lost record is rebuilt from it).
    """
    root.logs.close(sid)  # the repair below must be the only open of this log
    if recorded and root.summary is not None:
        summarized = _from_summary(root, root.summary, sid, report)
        if summarized is not None:
            return summarized
    # most agents of a checkpointed root: no Path, one open of the log, no listing
    quick = _unsealed_to_the_end(root, sid, root.logs.path_text(sid), report)
    if quick is not None:
        return _for_start(quick)
    path = root.logs.path(sid)
    try:
        os.stat(path)
    except FileNotFoundError:
        if not list_sealed(path):
            return None
        # a crash between sealing the active file and creating the next one: the
        # log is its segments (opening it creates the active file)
    except OSError as exc:
        return access.unreadable(sid, path, exc, then=THEN)
    try:
        collected = _read_log(root, sid, path, report)
    except OSError as exc:  # EACCES, EIO, a failed fsync: it costs this agent only
        return access.unreadable(sid, path, exc, then=THEN)
    except HistoryGone as gone:  # nothing that holds says what the missing part held
        return access.history_gone(sid, path, gone.first, then=THEN)
    if collected.damage:
        report.log_damage[sid] = collected.damage
    return _for_start(collected)


def _for_start(facts: AgentFacts) -> AgentFacts:
    """``facts`` without what a start does not use: the summary of the last completed
    turn (``recover --dry-run`` reads it from the log; a checkpoint built later
    reads its own from the store). Held for 10,000 agents at once, it was 5 MiB of a
    start's peak memory."""
    facts.last_complete = None
    return facts


def _read_log(root: RootStores, endpoint: str, path: Path, report: RecoveryReport) -> AgentFacts:
    """An endpoint's facts: from its newest checkpoint that holds, the log after it
    (repaired); without one, the whole log, repaired in the same read."""
    sealed, names = list_log(path)
    first_active = active_start(path, sealed, names)
    checkpoint, facts = _usable_checkpoint(root, endpoint, path, sealed, first_active, report)
    if checkpoint is not None:
        end = _checkpointed_end(checkpoint, path, sealed, first_active, names)
        if end is not None:  # the log ends where its checkpoint does: nothing to read
            root.logs.remember(endpoint, end)
            return facts
    damage = DamageReport()
    resume: Resume | None = None
    start: Position | None = None
    carried = None
    floor = 0
    if checkpoint is not None:
        carried = facts.ceiling()
        start = checkpoint.at.after()
        floor = checkpoint.at.seq
    elif (sealed[0].first if sealed else first_active) > 1:
        raise HistoryGone(sealed[0].first if sealed else first_active)
    elif sealed:
        start = Position(sealed[0].first, 0)
    # Sealed segments removed after the last one left: their entries are lost. Reported
    # when this read goes over them (a checkpoint past them already counted them).
    hole = missing_before_active(sealed, first_active)
    if start is not None and start.file_first == first_active:
        resume = Resume(start.offset, floor)
        hole = None
    elif start is not None:  # the sealed segments (from the checkpoint's on) first
        for batch in sealed_batches(path, start, damage, KNOWN_EVENTS, set(), floor):
            facts.add_all(batch)
    if hole is not None:
        damage.add_gap(*hole, START_NAME)
    # A log that is one file from entry 1 (no checkpoint, segment, base or start
    # record) is read whole here: its conversation comes with the facts, for the
    # agent's first turn (LogPool.keep_conversation), from the entries a read of the
    # repaired log gives (tests: test_conversation_builder).
    built: ConversationBuilder | None = None
    sink: Sink = facts.add_all
    if (
        checkpoint is None
        and endpoint != USER
        and not sealed
        and first_active == 1
        and BASE_NAME not in names
        and START_NAME not in names
    ):
        built = ConversationBuilder()
        sink = _feeding(facts.add_all, built.add_all)
    opened = repair_log(path, sink, resume, (sealed, first_active, names))
    kept = opened.kept_damage()
    damage.items.extend(kept.items)
    damage.unknown_events.extend(kept.unknown_events)
    facts.count_damage(path, damage, start, carried)
    facts.count_missing(path, damage, start)
    cut_starts = [
        item.started_turn
        for item in opened.damage.items
        if item.offset >= opened.valid_end and item.started_turn is not None
    ]
    if cut_starts:
        root.cut_turn_starts[endpoint] = max(cut_starts)
        facts.cut_turn_start(max(cut_starts))
    whole_lines_cut = opened.whole_lines_cut()  # may be lost: see recovery's doubt
    if (
        opened.truncated_bytes
        or opened.pending_replayed
        or opened.pending_discarded
        not in (
            None,
            "already_logged",  # the normal leftover of a crash after a durable append
        )
    ):
        report.log_repairs[endpoint] = {
            "truncated_bytes": opened.truncated_bytes,
            "pending_replayed": opened.pending_replayed,
            "pending_discarded": opened.pending_discarded,
        }
        if whole_lines_cut:
            report.log_repairs[endpoint]["whole_lines_cut"] = whole_lines_cut
    for kind, count in damage.counts().items():
        facts.damage[kind] = facts.damage.get(kind, 0) + count
    gaps = damage.gaps()  # in what was read: a checkpoint that held covers the rest
    if gaps:
        report.log_gaps[endpoint] = [[first, last] for first, last in gaps]
    report.events_read += facts.entries
    root.logs.remember(endpoint, opened.resume())
    if built is not None:
        root.logs.keep_conversation(endpoint, built.turns, opened.stat)
    return facts


def _feeding(*sinks: Sink) -> Sink:
    """One sink that hands each batch to every one of ``sinks``, in order."""

    def feed(batch: list[Entry]) -> None:
        for sink in sinks:
            sink(batch)

    return feed


class HistoryGone(Exception):
    """A log whose first segments are missing (removed by hand: the first sealed
    segment starts after entry 1, or with none left the start record says the active
    file does), with no checkpoint that holds for it: what they said is known nowhere."""

    def __init__(self, first: int) -> None:
        super().__init__(first)
        self.first = first


def _unsealed_to_the_end(
    root: RootStores, endpoint: str, path: str, report: RecoveryReport
) -> AgentFacts | None:
    """The facts of a log never sealed whose newest checkpoint ends at its last byte,
    without listing its directory (most logs of a root with many agents); None for
    any other log, which :func:`_read_log` then lists and reads as always.

    The checkpoint is checked as ever (:func:`~substrat.checkpoints.line_mismatch`
    on the line where it says its entry is), taking the active file as the file
    that entry must be in: had the log been sealed since, that file would hold
    another entry there, or none. The log ends there as :func:`_checkpointed_end`
    demands (no byte after it, no pending entry, no failed append to take back), and
    it opens for writing (the repair's open would fail: it says why). One open of
    the log does all of it.
    """
    checkpoint = root.checkpoints.newest(endpoint)
    if checkpoint is None or checkpoint.at.file_first != 1 or is_suspect(path):
        return None
    at = checkpoint.at
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        line = os.pread(fd, at.length, at.offset) if size == at.offset + at.length else b""
    except OSError:
        return None
    finally:
        os.close(fd)
    if not line or line_mismatch(at, line) is not None:
        return None
    try:  # a string, not os.path's join and dirname: a restart asks this per agent
        os.lstat(path[: path.rfind(os.sep) + 1] + PENDING_NAME)
    except OSError:  # as os.path.lexists has it
        pass
    else:
        return None
    try:
        facts = checkpoint.load_facts()
    except ValueError:
        return None  # said by the full path, which tries it again
    checkpoint.release()
    report.checkpoints_used += 1
    root.used[endpoint] = checkpoint
    root.logs.remember(endpoint, Resume(size, at.seq))
    return facts


def _from_summary(
    root: RootStores, summary: Summary, sid: str, report: RecoveryReport
) -> AgentFacts | None:
    """The agent's facts from its start summary entry, if it holds
    (:meth:`~substrat.start_summary.Summary.log_holds`). None otherwise (then it is
    read as always, and the report says its entry was passed over). A quiet agent's
    entry was taken before this, whole (:mod:`substrat.recovery_quiet`)."""
    entry = summary.agents.pop(sid, None)  # used once: what it holds goes with it
    if entry is None:
        return None
    try:
        st, row = summary.log_holds(sid, entry, root.logs.path_text)
        facts = facts_of(sid, entry[2])
    except (OSError, ValueError, TypeError, IndexError):
        report.summary_passed_over.append(sid)
        return None
    report.checkpoints_used += 1
    report.summary_used += 1
    root.summarized.append(sid)
    root.logs.remember(sid, Resume(st.st_size, row[0], True))
    return facts


def _checkpointed_end(
    checkpoint: Checkpoint,
    path: Path,
    sealed: list[Segment],
    first_active: int,
    names: frozenset[str],
) -> Resume | None:
    """Where the log ends if it ends with the (verified) checkpoint's last entry, with
    nothing after it to read or repair: no byte past it, no pending entry, no failed
    append of this process to take back, and the file writable. None otherwise (the
    log is then opened and repaired from the checkpoint on, as always, and a log that
    cannot be opened for writing holds its agent back)."""
    at = checkpoint.at
    if is_suspect(path):
        return None
    try:
        size = os.stat(path).st_size
        if at.file_first == first_active:
            ends_there = size == at.offset + at.length
        elif not sealed:
            return None  # it names a segment the log does not have
        else:  # sealed right after the checkpoint: it ends its last segment, nothing after
            last = sealed[-1]
            ends_there = (
                size == 0
                and at.file_first == last.first
                and at.seq == last.last
                and not last.archived  # an archive's length is not known without reading it
                and os.stat(last.path).st_size == at.offset + at.length
            )
    except FileNotFoundError:
        return None
    if not ends_there or PENDING_NAME in names:  # as the listing a moment ago saw it
        return None
    if not os.access(path, os.W_OK):  # the repair's open for writing would fail: it says why
        return None
    return Resume(size, at.seq)


def _usable_checkpoint(
    root: RootStores,
    endpoint: str,
    path: Path,
    sealed: list[Segment],
    first_active: int,
    report: RecoveryReport,
) -> tuple[Checkpoint | None, AgentFacts]:
    """The endpoint's newest checkpoint that holds against its log, with its facts (the
    one in the log's base last: see :mod:`substrat.logbase`)."""
    based = base_candidates(path, sealed[0].first if sealed else first_active)
    for checkpoint in [*root.checkpoints.latest(endpoint), *based]:
        reason = verify(checkpoint, path, sealed, first_active)
        if reason is None:
            try:
                facts = checkpoint.load_facts()
            except ValueError as exc:
                reason = f"its facts do not read ({exc})"
            else:
                checkpoint.release()
                report.checkpoints_used += 1
                root.used[endpoint] = checkpoint
                return checkpoint, facts
        report.checkpoints_rejected.setdefault(endpoint, reason)
    report.read_in_full.append(endpoint)
    return None, AgentFacts(endpoint)


def read_user(root: RootStores, report: RecoveryReport) -> AgentFacts:
    """The user's log, read like an agent's (from its checkpoint, repaired)."""
    user_log = root.logs.path(USER)
    if not os.path.exists(user_log.parent):
        return AgentFacts(USER)
    root.logs.close(USER)
    quick = _unsealed_to_the_end(root, USER, os.fspath(user_log), report)
    if quick is None:
        quick = _read_log(root, USER, user_log, report)
    return _for_start(quick)
