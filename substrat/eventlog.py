"""The per-session append-only event log: the source of truth for recovery.

One JSON object per line::

    {"crc":"1a2b3c4d","seq":7,"session_id":"...","ts":"...","event":"turn.start","data":{...}}

* ``seq`` is monotonic per log, so a replayed entry is recognised wherever it sits.
* ``crc`` is the CRC-32 of the line's bytes with the ``"crc":"...",`` member
  removed (that is, of ``{"seq":...}``), so damage is told apart from data
  without re-serialising anything. The line stays plain JSON for other tools.

Writing (``EventLog.log``) makes one fsync, the physical floor: the entry is
written to ``events.pending`` (in place at offset 0, not fsynced), appended to
``events.jsonl``, and the log is fsynced; ``log`` returns only after that
fsync, so a returned ``seq`` is durable.

The pending copy is a second copy of the newest entry that outlives a killed
process (the page cache keeps it): if the log's last line is later damaged, a
kill -9 having left the file behind, the next open restores that entry from it
(tests/integration/test_turn_ids.py, "killed"). It is not fsynced: it only
ever helped entries not yet acknowledged (until issue 15 it was fsynced too,
which doubled the cost of every entry). A stale pending entry is harmless,
because replay is keyed on ``seq``: it is appended only if that ``seq`` is
nowhere in the log. The file is unlinked on close.

A failed append is taken back before ``log`` raises: the log is cut back to
its last durable end and fsynced, and the pending copy is voided and fsynced
(writeback may have put either on the disk). So an entry reported as failed
(:class:`~substrat.errors.DurabilityError`) never comes back, in this process
or after any crash. If taking it back fails too, its fate is unknown
(:class:`~substrat.errors.OutcomeUnknownError`): a power loss may keep it or
not. This process never shows it: the next open here cuts it back first, and
durably, so once an open has shown it gone it stays gone.

Opening repairs: bytes after the last valid line (a torn or NUL-padded tail) are
cut off, so a new append is never glued onto a partial line, and a leftover
pending entry is appended only if its ``seq`` is not already anywhere in the log.
The cut is not fsynced on its own: only unacknowledged bytes go, and the next
append's fsync makes the cut durable together with the entry. Numbering goes on
after the sealed segments, or with none left after where the log's start
record says the active file starts (never from 1 again), and an open for
appending writes that record when the segments' names say more than it does
(see :mod:`substrat.segments`).

Reading (``read_log``, ``iter_log``, in :mod:`substrat.logread` and
re-exported here) never raises on damage: bad lines are skipped, counted and
described in a :class:`DamageReport`.
"""

from __future__ import annotations

import errno
import gc
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from substrat import persistence
from substrat.errors import (
    DurabilityError,
    EntryTooLargeError,
    LogClosedError,
    OutcomeUnknownError,
)
from substrat.events import KNOWN_EVENTS
from substrat.jsontext import MAX_INT as MAX_INT
from substrat.jsontext import MAX_NESTING_DEPTH as MAX_NESTING_DEPTH
from substrat.jsontext import MIN_INT as MIN_INT
from substrat.jsontext import check_plain_json as check_plain_json
from substrat.logline import encode_entry as encode_entry
from substrat.logread import BATCH_LINES as BATCH_LINES
from substrat.logread import Damage as Damage
from substrat.logread import DamageReport, Entry, decode_line, entry_batches
from substrat.logread import LogRead as LogRead
from substrat.logread import iter_log as iter_log
from substrat.logread import read_log as read_log
from substrat.oserrors import with_advice
from substrat.segments import Segment, active_start, ensure_start, list_log, sibling_path
from substrat.timestamps import utc_now_iso as utc_now_iso

LOG_NAME = "events.jsonl"
PENDING_NAME = "events.pending"
PAST_THE_SUMMARY = "past_the_start_summary"
"""``OpenReport.pending_discarded`` for a pending entry set aside (see Resume.summarized)."""
MAX_ENTRY_BYTES = 1 << 20
_RESERVED_KEYS = frozenset({"crc", "seq", "ts", "event", "data"})

Clock = Callable[[], str]
Sink = Callable[[list[Entry]], None]
"""Takes healthy entries in file order, a batch at a time."""
Listed = tuple[list[Segment], int, frozenset[str]]
"""A log's sealed segments and the names in its directory (:func:`~substrat.segments.list_log`),
and the entry its active file starts at (:func:`~substrat.segments.active_start`), as a
caller that has just listed them passes them on to an open (recovery reads them all
before the log): the open does not list the directory and read the start record
again, nor look for an active file or a pending entry the listing did not show."""


@dataclass(frozen=True, slots=True)
class Resume:
    """A known-good position in an active log file: everything before ``offset`` is
    intact and ends with entry ``last_seq`` (a checkpoint's, or where the log was
    closed). Opening scans (and repairs) only what follows."""

    offset: int
    last_seq: int
    summarized: bool = False
    """Taken from a start summary (:mod:`substrat.start_summary`): nothing has written
    the log's directory since the clean stop that wrote the summary, so a pending entry
    found past ``last_seq`` at the first open was not left by substrat (a crash leaves
    no summary) but put there by hand: it is set aside (``pending_discarded``), never
    replayed into a log whose agent the summary gave without it."""


@dataclass
class OpenReport:
    """What opening a log repaired."""

    truncated_bytes: int = 0
    pending_replayed: bool = False
    pending_discarded: str | None = None
    last_seq: int = 0
    damage: DamageReport = field(default_factory=DamageReport)
    valid_end: int = 0
    """Where the log ends after the repair, not counting a replayed pending entry."""
    end: int = 0
    """Where the active file ends after the repair (a replayed pending entry included)."""
    pending_found: bool = False
    stat: os.stat_result | None = None
    """The active file's ``fstat`` after the scan, if the repair then wrote nothing to
    it (no cut, no replay): what a ``stat`` of it says until something writes it."""

    def resume(self) -> Resume:
        """Where a later open of this (unchanged) log can start."""
        return Resume(self.end, self.last_seq)

    def whole_lines_cut(self) -> int:
        """Whole lines (a newline at their end) the repair cut off with a damaged
        tail, less the one a replayed pending copy put back. Such a line may be an
        acknowledged entry damaged since, not a torn append."""
        cut = sum(
            1
            for d in self.damage.items
            if d.offset >= self.valid_end and d.kind != "torn_tail" and d.missing is None
        )
        return cut - min(cut, int(self.pending_replayed))

    def kept_damage(self) -> DamageReport:
        """The damage still in the log after the repair (a cut tail is gone)."""
        kept = [d for d in self.damage.items if d.offset < self.valid_end]
        return DamageReport(kept, list(self.damage.unknown_events))


_SUSPECT_END: dict[str, int] = {}
"""Logs whose failed append could not be taken back yet: path -> durable end offset."""


def any_suspect() -> bool:
    """Whether any log waits for a failed append to be taken back (see :func:`is_suspect`)."""
    return bool(_SUSPECT_END)


def is_suspect(path: str | os.PathLike[str]) -> bool:
    """Whether a failed append to the log at ``path`` still waits to be taken back (the
    next open of it does that)."""
    return str(path) in _SUSPECT_END


class EventLog:
    """An open, append-only, fsynced event log for one session.

    Use as a context manager, or call :meth:`close`. ``context`` fields (for
    example ``{"session_id": ...}``) are written into every entry.

    Opening reads the whole log once to repair it. A reader that wants the
    entries too passes ``sink``: it gets every healthy entry of a known event
    type in file order (the replayed pending entry last), exactly what
    :func:`read_log` would yield after the repair, and entries of unknown types
    land in ``report.damage.unknown_events``. So recovery reads each log once.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        context: Mapping[str, Any] | None = None,
        *,
        clock: Clock = utc_now_iso,
        sink: Sink | None = None,
        writable: bool = True,
        resume: Resume | None = None,
        on_append: Callable[[int], None] | None = None,
        listed: Listed | None = None,
    ) -> None:
        # a Path given is kept (it formats its text once), and the pending path with it
        self.path = path if isinstance(path, Path) else Path(path)
        self.pending_path = sibling_path(self.path, PENDING_NAME)
        self._context = dict(context or {})
        clash = _RESERVED_KEYS & self._context.keys()
        if clash:
            raise ValueError(f"context keys {sorted(clash)} are reserved by the log format")
        check_plain_json(self._context, "context")
        self._clock = clock
        self._on_append = on_append
        self._fd: int | None = None
        self._pending_fd: int | None = None
        self._durable_end = 0
        self.report = self._open(sink, writable, resume, listed)
        self._next_seq = self.report.last_seq + 1

    @property
    def last_seq(self) -> int:
        """The ``seq`` of the newest durable entry (0 for an empty log)."""
        return self._next_seq - 1

    @property
    def durable_end(self) -> int:
        """Bytes of the active file that are durable (every entry :meth:`log` returned)."""
        return self._durable_end

    def resume(self) -> Resume:
        """Where a later open of this log can start (see :class:`Resume`)."""
        return Resume(self._durable_end, self.last_seq)

    def _open(
        self, sink: Sink | None, writable: bool, resume: Resume | None, listed: Listed | None
    ) -> OpenReport:
        report = OpenReport()
        # A listing taken just now that lacks the file is not asked again: were the file
        # there after all, its create opens it as it is (no truncation) and fsyncs the
        # directory, which changes nothing a crash can leave.
        if listed is not None:
            absent = self.path.name not in listed[2]
        else:
            absent = not os.path.exists(self.path)
        if absent:
            persistence.durable_create(self.path)
        if str(self.path) in _SUSPECT_END:
            self._cut_back_suspect_tail(_SUSPECT_END[str(self.path)])
        # Entries before the active file (sealed segments) or before a known-good
        # position (resume) are not scanned again: only what follows can need repair.
        # Numbering goes on past the sealed segments, or past what the start record
        # says they held once they are all gone (never from 1 again).
        if listed is None:  # one listing: the start record and the pending entry are
            # looked for only when it shows them (nothing below creates either)
            sealed, names = list_log(self.path)
            floor = active_start(self.path, sealed, names) - 1
        else:  # the caller listed the directory just now (recovery: see Listed)
            sealed, floor, names = listed[0], listed[1] - 1, listed[2]
        # One descriptor reads the file for the repair and then appends to it (an open
        # and a close fewer per log than a read-only one for the scan). If the file
        # does not open for both, each is opened on its own as they always were, so
        # whatever fails fails as it did (a file that can be written but not read
        # still opens without a scan when there is nothing to scan).
        try:
            fd: int | None = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
        except OSError:
            fd = None
        try:
            # One fstat of the descriptor, before the scan: its size is where the scan's
            # reads stop (substrat.logread.file_lines), and it is the report's stat, as
            # nothing writes the file before the repair does (below).
            found = None if fd is None else os.fstat(fd)
            start, size = 0, -1
            if resume is not None:
                size = os.stat(self.path).st_size if found is None else found.st_size
                if resume.offset <= size:
                    start, floor = resume.offset, max(floor, resume.last_seq)
            unscanned = start == size and fd is not None  # size: this descriptor's fstat
            if start == size:
                # Nothing after the known-good position (a log reopened where it was
                # left): what a scan of no bytes finds, without reading nothing.
                scan = _RepairScan(start, 0, set())
            elif fd is not None and found is not None:
                scan = _scan_for_repair(fd, report.damage, sink, start, floor, found.st_size)
            else:
                scan = _scan_for_repair(self.path, report.damage, sink, start, floor)
            report.valid_end = scan.valid_end
            if fd is None:
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        except BaseException:  # the scan's own read handle was closed the same way
            if fd is not None:
                os.close(fd)
            raise
        try:
            if not unscanned:  # (nothing scanned: the report keeps no stat, as it did)
                report.stat = os.fstat(fd) if found is None else found
                size = report.stat.st_size
            if size > scan.valid_end:
                # Not fsynced: the cut bytes were never acknowledged, so a crash that
                # brings them back loses nothing (the next open cuts them again), and
                # the next append's fsync makes the cut durable with the entry.
                os.ftruncate(fd, scan.valid_end)
                report.truncated_bytes = size - scan.valid_end
                report.stat = None
            report.last_seq = max(scan.max_seq, floor)
            report.end = scan.valid_end
            none_pending = PENDING_NAME not in names
            replay = None if none_pending else self._pending_to_replay(scan.seqs, floor, report)
            if replay is not None and resume is not None and resume.summarized:
                report.pending_discarded = PAST_THE_SUMMARY  # see Resume.summarized
                replay = None
            if replay is not None:
                persistence.write_all(fd, replay[1])
                persistence.fsync_fd(fd, self.path)
                report.end += len(replay[1])
                report.pending_replayed = True
                report.stat = None
                report.last_seq = max(report.last_seq, replay[0])
                if sink is not None:
                    if replay[2].get("event") in KNOWN_EVENTS:
                        sink([replay[2]])
                    else:
                        report.damage.unknown_events.append(replay[2])
            if not writable:
                os.close(fd)
                if report.pending_found:  # what close() would have done
                    _unlink_quietly(self.pending_path)
                return report
            ensure_start(self.path, sealed)  # a roll a crash cut short, or an old root
            pending_fd = os.open(self.pending_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError:
            os.close(fd)
            raise
        self._fd = fd
        self._pending_fd = pending_fd
        # the file's size now: cut to the valid end, then the replayed entry (if any)
        self._durable_end = report.end
        return report

    def _cut_back_suspect_tail(self, durable_end: int) -> None:
        """Finish :meth:`_take_back` for a log whose failed append is not taken back yet.

        The cut is made again even when the page cache already shows it: the failed
        fsync dropped the earlier cut with the other dirty state, so the disk may
        still hold the entry, and only a cut fsynced now settles it for good (an
        open that has shown the entry gone must not see it come back).
        """
        fd = os.open(self.path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.ftruncate(fd, durable_end)
            persistence.fsync_fd(fd, self.path)
        finally:
            os.close(fd)
        if os.path.exists(self.pending_path):
            fd = os.open(self.pending_path, os.O_WRONLY | os.O_CLOEXEC)
            try:
                _pwrite_all(fd, b"\n")
                persistence.fsync_fd(fd, self.pending_path)
            finally:
                os.close(fd)
        del _SUSPECT_END[str(self.path)]

    def _pending_to_replay(
        self, seqs: set[int], floor: int, report: OpenReport
    ) -> tuple[int, bytes, Entry] | None:
        try:
            raw = persistence.read_bytes(self.pending_path)
        except FileNotFoundError:
            return None
        report.pending_found = True
        line, newline, _stale = raw.partition(b"\n")
        if not newline:
            report.pending_discarded = "torn" if raw else None
            return None
        decoded = decode_line(line)
        if isinstance(decoded, str):
            report.pending_discarded = decoded
            return None
        if decoded["seq"] in seqs or decoded["seq"] <= floor:
            report.pending_discarded = "already_logged"
            return None
        return decoded["seq"], line + b"\n", decoded

    def log(self, event: str, data: Mapping[str, Any] | None = None) -> int:
        """Append one entry durably and return its ``seq``.

        Returns only after the entry is fsynced. Raises TypeError for data that
        is not plain JSON and EntryTooLargeError over ``MAX_ENTRY_BYTES``, both
        before a byte is written. On an I/O failure the log is poisoned; reopen
        it to continue. The entry was not acknowledged, and it was taken back:
        :class:`DurabilityError` means it will never appear, in this process or
        after a crash; :class:`OutcomeUnknownError` means taking it back failed
        too, so a crash may keep it (this process never shows it).
        """
        if self._fd is None or self._pending_fd is None:
            raise LogClosedError(f"event log {self.path} is closed; open a new EventLog")
        if not isinstance(event, str) or not event:
            raise TypeError("event must be a non-empty string")
        payload: Mapping[str, Any] = {} if data is None else data
        check_plain_json(payload)
        body: dict[str, Any] = {"seq": self._next_seq}
        body.update(self._context)
        body["ts"] = self._clock()
        body["event"] = event
        body["data"] = payload
        line = encode_entry(body)
        if len(line) > MAX_ENTRY_BYTES:
            raise EntryTooLargeError(
                f"entry {event!r} is {len(line)} bytes, over the {MAX_ENTRY_BYTES}-byte limit; "
                "keep large payloads out of the log"
            )
        seq = int(body["seq"])
        try:
            _pwrite_all(self._pending_fd, line)
            persistence.write_all(self._fd, line)
            persistence.fsync_fd(self._fd, self.path)
            _check_linked(self._fd, self.path)
        except OSError as exc:
            # A simulated kill (BaseException) is deliberately not caught here:
            # a killed process runs no cleanup.
            taken_back = self._take_back()
            self._poison()
            if not taken_back:
                raise OutcomeUnknownError(
                    f"append of entry {seq} to {self.path} failed ({exc}) and could not be "
                    "taken back: a crash may keep it or not; treat it as undecided until "
                    "a restart has recovered the log"
                ) from exc
            # what the host needs first: "reopen the log" is for this object's caller
            taken = (
                f"append of entry {seq} to {self.path} failed ({exc}) and was taken back: "
                "it will not appear (reopen the log before writing again)"
            )
            raise DurabilityError(with_advice(taken, exc, first=True)) from exc
        self._appended(line)
        return seq

    def _appended(self, line: bytes) -> None:
        """Count ``line`` as durable (it is: its fsync returned) and tell the hook."""
        self._next_seq += 1
        self._durable_end += len(line)
        if self._on_append is not None:
            self._on_append(len(line))

    def _take_back(self) -> bool:
        """Cut the log back to its last durable end and void the pending copy, durably;
        False if that failed too.

        After a failed fsync Linux may have dropped the dirty pages while the
        process still reads them from the cache (a reopen would trust bytes that
        never reach the disk and glue the next entry after them), or may have
        written some or all of them (a crash would keep an entry reported as
        failed); writeback may have put the pending copy on the disk as well. The
        cut, the void and their fsyncs rule all of that out. If they fail, the
        path stays suspect and the next open in this process does it first.
        """
        _SUSPECT_END[str(self.path)] = self._durable_end
        assert self._fd is not None and self._pending_fd is not None
        try:
            os.ftruncate(self._fd, self._durable_end)
            persistence.fsync_fd(self._fd, self.path)
            _pwrite_all(self._pending_fd, b"\n")
            persistence.fsync_fd(self._pending_fd, self.pending_path)
        except OSError:
            return False
        _SUSPECT_END.pop(str(self.path), None)
        return True

    def _poison(self) -> None:
        for fd in (self._fd, self._pending_fd):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._fd = self._pending_fd = None

    def close(self) -> None:
        """Close the log. Entries already returned by :meth:`log` are durable.

        The pending file is removed; its removal need not be durable (a stale
        pending entry is found in the log and never appended again).
        """
        was_open = self._fd is not None
        self._poison()
        if was_open:
            _unlink_quietly(self.pending_path)

    @property
    def closed(self) -> bool:
        return self._fd is None

    def __enter__(self) -> EventLog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _check_linked(fd: int, path: Path) -> None:
    """Refuse an entry synced to a log file no directory names any more.

    A root removed (``rm -rf``) under a running daemon leaves its open logs unlinked:
    writes and fsyncs still succeed, into files nothing will ever read again. One
    fstat per append (measured: docs/benchmarks.md) makes that a refusal, taken back
    like any failed append, instead of an acknowledged turn that cannot be recovered.
    """
    if os.fstat(fd).st_nlink == 0:
        raise FileNotFoundError(
            errno.ENOENT,
            "the file was deleted while open (its root or agent directory was removed?): "
            "nothing written to it can be recovered",
            str(path),
        )


def _pwrite_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    offset = 0
    while offset < len(data):
        written = os.pwrite(fd, view[offset:], offset)
        if written <= 0:
            raise DurabilityError(f"pwrite returned {written}; the device accepted no bytes")
        offset += written


@dataclass
class _RepairScan:
    valid_end: int
    max_seq: int
    seqs: set[int]


def _scan_for_repair(
    path: Path | int,
    damage: DamageReport,
    sink: Sink | None,
    start: int,
    floor: int,
    size: int | None = None,
) -> _RepairScan:
    seqs: set[int] = set()
    tail = [start]
    # Unknown event types still count for the repair: entry_batches takes every seq
    # before it filters on the type; only the sink is spared them, as read_log
    # would spare its reader.
    known = None if sink is None else KNOWN_EVENTS
    batches = entry_batches(path, damage, known, seqs, tail, start=start, min_seq=floor, end=size)
    for batch in batches:
        if sink is not None:
            sink(batch)
    return _RepairScan(tail[0], max(seqs, default=0), seqs)


def _unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def repair_log(
    path: str | os.PathLike[str],
    sink: Sink | None = None,
    resume: Resume | None = None,
    listed: Listed | None = None,
) -> OpenReport:
    """Repair the log at ``path`` as opening it does, feeding ``sink``; leave it closed.

    One read of the file serves both the repair and the reader (see
    :class:`EventLog`). No pending file is created; one that was there is
    removed afterwards, as :meth:`EventLog.close` would.

    The cyclic garbage collector is paused meanwhile: a scan allocates a dict
    per line and none of them is part of a cycle, so its passes (about a tenth
    of a long recovery) would find nothing. Reference counting still frees
    everything at once.
    """
    paused = gc.isenabled()
    gc.disable()
    try:
        return EventLog(path, sink=sink, writable=False, resume=resume, listed=listed).report
    finally:
        if paused:
            gc.enable()
