"""Reading an event log: healthy entries out, damage skipped, counted and described.

The line format and the writer are in :mod:`substrat.eventlog`, which
re-exports everything here (one line's codec is :mod:`substrat.logline`). A
reader never raises on damage: a torn tail, NUL padding, invalid UTF-8 or JSON,
a bad checksum, a duplicate ``seq`` and (if asked) an unknown event type each
cost only their own line.
"""

from __future__ import annotations

import errno
import io
import itertools
import os
import re
import stat
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import orjson

from substrat.events import KNOWN_EVENTS, TURN_START
from substrat.jsontext import BIG_TEXT_BYTES, loads
from substrat.logline import BODY_START, CRC_HEX_END, CRC_OF_OPEN_BRACE, CRC_PREFIX, Entry
from substrat.logline import decode_line as decode_line
from substrat.segments import (
    START_NAME,
    Position,
    Segment,
    StartUnreadable,
    active_start,
    archive_damage,
    list_sealed,
    missing_before_active,
    open_segment,
    read_start,
)

_EXCERPT_BYTES = 80
SEQ_GAP = "seq_gap"
"""The damage kind of entries missing between healthy ones (see the module docstring)."""
DAMAGED_ARCHIVE = "damaged_archive"
"""The damage kind of an archived segment that does not read to its end (truncated, corrupt)."""
_NOT_A_LINE = ("torn_tail", "duplicate_seq", "missing_segment", SEQ_GAP, DAMAGED_ARCHIVE)
"""Damage kinds that cannot hide a missing entry's ``seq`` (see :func:`_check_gaps`)."""
_TURN_START_MARK = b'"event":"%s"' % TURN_START.encode()
# A key, not text: inside a JSON string the quotes would be escaped.
_TURN_ID_KEY = re.compile(rb'"turn_id":"t([1-9][0-9]{0,17})"')


def _decode_fast(raw: bytes) -> Entry | None:
    """:func:`decode_line` for a healthy line still ending in its newline, else None.

    The hot path of every read: no copy to strip the newline (JSON allows the
    trailing whitespace) and no damage classification. Whatever it returns,
    decode_line returns too.
    """
    if not raw.startswith(CRC_PREFIX) or raw[CRC_HEX_END:BODY_START] != b'",':
        return None
    try:
        expected = int(raw[len(CRC_PREFIX) : CRC_HEX_END], 16)
    except ValueError:
        return None
    if (
        len(raw) <= BODY_START + 1
        or zlib.crc32(memoryview(raw)[BODY_START:-1], CRC_OF_OPEN_BRACE) != expected
    ):
        return None
    body = b"{" + raw[BODY_START:]
    try:
        entry = orjson.loads(body) if len(body) < BIG_TEXT_BYTES else loads(body)
    except orjson.JSONDecodeError:
        return None
    if type(entry) is dict and isinstance(entry.get("seq"), int):
        return entry
    return None


def _started_turn(raw: bytes) -> int | None:
    if _TURN_START_MARK not in raw:
        return None
    match = _TURN_ID_KEY.search(raw)
    return None if match is None else int(match.group(1))


@dataclass(frozen=True)
class Damage:
    """One damaged region of a log."""

    kind: str
    offset: int
    length: int
    line_no: int
    excerpt: str
    file: str = ""
    """The sealed segment it is in (its file name); empty for the active file."""
    started_turn: int | None = None
    """For a damaged complete line whose bytes still show a ``turn.start`` and its
    ``turn_id``: that turn's number. A repair that cuts such a line off the end of a
    log tells recovery, which must not hand that id out again."""
    missing: tuple[int, int] | None = None
    """For a ``seq_gap``: the first and last ``seq`` of the entries not in the file."""

    @property
    def entries_missing(self) -> int:
        return 0 if self.missing is None else self.missing[1] - self.missing[0] + 1


@dataclass
class DamageReport:
    """What a read skipped, and why. Empty means the log was clean."""

    items: list[Damage] = field(default_factory=list)
    unknown_events: list[Entry] = field(default_factory=list)

    def add(self, kind: str, offset: int, raw: bytes, line_no: int, file: str = "") -> None:
        excerpt = raw[:_EXCERPT_BYTES].decode("utf-8", "backslashreplace")
        started = _started_turn(raw) if raw.endswith(b"\n") else None
        self.items.append(Damage(kind, offset, len(raw), line_no, excerpt, file, started))

    def add_gap(self, first: int, last: int, file: str = "", kind: str = SEQ_GAP) -> None:
        """Entries ``first``..``last`` missing whole: from a file (``seq_gap``), or with
        the segment that held them (``missing_segment``)."""
        excerpt = f"entries {first}-{last}" if last > first else f"entry {first}"
        self.items.append(Damage(kind, 0, 0, 0, excerpt, file, missing=(first, last)))

    def gaps(self) -> list[tuple[int, int]]:
        """The ``seq`` ranges missing, in the order found."""
        return [d.missing for d in self.items if d.missing is not None]

    def counts(self) -> dict[str, int]:
        """Damaged lines per kind (for ``seq_gap``: entries missing)."""
        tally: dict[str, int] = {}
        for item in self.items:
            tally[item.kind] = tally.get(item.kind, 0) + (item.entries_missing or 1)
        if self.unknown_events:
            tally["unknown_event"] = len(self.unknown_events)
        return tally

    @property
    def clean(self) -> bool:
        return not self.items and not self.unknown_events

    def torn_tail_bytes(self) -> int:
        return sum(d.length for d in self.items if d.kind == "torn_tail")


@dataclass
class LogRead:
    """The healthy entries of a log, in file order, and the damage skipped."""

    entries: list[Entry]
    damage: DamageReport
    valid_end: int = 0
    """Offset just past the last valid line: where a repair would cut."""


def iter_log(
    path: str | os.PathLike[str],
    damage: DamageReport,
    *,
    known_events: frozenset[str] | None = KNOWN_EVENTS,
    tail_info: list[int] | None = None,
) -> Iterator[Entry]:
    """Yield the healthy entries of the log at ``path``; never raises on damage.

    ``path`` is the active file (``events.jsonl``); its sealed segments (see
    :mod:`substrat.segments`) are read first, so this is the whole history.
    Damaged lines, duplicate ``seq`` values and (when ``known_events`` is given)
    unknown event types are skipped and recorded in ``damage``. A missing file
    reads as empty. If ``tail_info`` is given, its first element is set to the
    offset just past the last valid line of the active file.
    """
    for batch in history_batches(path, damage, known_events, set(), tail_info):
        yield from batch


BATCH_LINES = 1024
"""Entries are handed on in lists this long: one generator step per batch, not per line."""


def entry_batches(
    path: str | os.PathLike[str] | int,
    damage: DamageReport,
    known_events: frozenset[str] | None,
    seen: set[int],
    tail_info: list[int] | None,
    *,
    start: int = 0,
    min_seq: int = 0,
    first_seq: int | None = None,
    end: int | None = None,
) -> Iterator[list[Entry]]:
    """The healthy entries of one file in batches, from byte ``start``.

    ``seen`` collects their seqs, unknown types included; a seq already in
    ``seen`` or not above ``min_seq`` (the part before ``start`` holds those) is a
    duplicate. ``tail_info`` gets the offset just past the last valid line
    (``start`` if none). ``first_seq`` is the entry the read should begin with
    (``min_seq + 1`` if None; 0 checks for no gap; ``_FROM_START_RECORD``: where the
    log's start record says, or 1): a ``seq`` missing from there to the last entry
    read is a ``seq_gap``. ``path`` may be a descriptor open for reading (read from
    ``start``, left open: an open that repairs the log reads through the one it
    appends with); ``end``: its size as an fstat of that descriptor gave it (see
    :func:`file_lines`).
    """
    named_path = None if isinstance(path, int) else path
    try:
        if isinstance(path, int):
            fd = path
        else:
            fd, end = open_sized(path)
    except FileNotFoundError:
        if tail_info is not None:
            tail_info[:] = [start]
        return
    first = min_seq + 1 if first_seq is None else first_seq
    first_of = None
    if first_seq == _FROM_START_RECORD:  # read only if entries look missing (rare)
        assert not isinstance(path, int), "a start record is found by the log's path"
        named = path
        first, first_of = 1, (lambda: _start_of(named))
    try:
        lines = file_lines(fd, start, end)
        yield from _batches(
            lines, damage, known_events, seen, tail_info, start, min_seq, "", (first, 0), first_of
        )
    finally:
        if named_path is not None:  # opened here (a descriptor given is left open)
            os.close(fd)


READ_CHUNK = 1 << 16
"""Bytes a read of a log's file asks for at once (below malloc's mmap threshold)."""


def open_sized(path: str | os.PathLike[str]) -> tuple[int, int]:
    """A descriptor of the file at ``path`` open for reading (for :func:`file_lines`),
    and the file's size (the ``end`` that reads stop at), from the fstat that refuses it
    as ``open(path, "rb")`` refuses it: what ``os.open`` raises, and IsADirectoryError
    naming a directory (which ``os.open`` opens; ``open`` checks)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        found = os.fstat(fd)
        if stat.S_ISDIR(found.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), os.fspath(path))
    except BaseException:
        os.close(fd)
        raise
    return fd, found.st_size


def file_lines(fd: int, offset: int, end: int | None = None) -> Iterator[bytes]:
    """The lines of the file open at ``fd`` from byte ``offset``, each with its newline
    (the last one without, if the file does not end in one), split on ``\\n`` alone,
    as iterating a binary file object gives them.

    ``end``: the file's size as an fstat of ``fd`` gave it. Once the reads reach it
    they stop, without the read past it that finds nothing (a small log is read in
    one read instead of two). The file is still read at least once, so a read that
    fails fails as before. A file that grows meanwhile (not a held root's) is read to
    the end of the chunk that reached ``end``, as a read a moment earlier would.

    Read with ``os.pread`` in chunks of :data:`READ_CHUNK` instead of through a
    buffered file object: most logs are a few lines, and a file object (its raw layer,
    its buffer) cost more than the lines it read (on faultfs, the crash fuzzer's disk,
    a third of a small log's read). The lines of a chunk are split in C, and handed on
    through ``chain`` (no Python frame per line).
    """
    return itertools.chain.from_iterable(_chunk_lines(fd, offset, end))


def _chunk_lines(fd: int, offset: int, size: int | None) -> Iterator[list[bytes]]:
    parts: list[bytes] = []  # a line longer than a chunk, until its newline is read
    while chunk := os.pread(fd, READ_CHUNK, offset):
        offset += len(chunk)
        end = chunk.rfind(b"\n") + 1
        if not end:
            parts.append(chunk)
        else:
            if parts:
                parts.append(chunk[:end])
                whole = b"".join(parts)
                parts = []
            else:
                whole = chunk if end == len(chunk) else chunk[:end]
            if end < len(chunk):
                parts.append(chunk[end:])
            yield io.BytesIO(whole).readlines()  # split on b"\n" alone, as a binary file is
        if size is not None and offset >= size:
            break  # the size its fstat gave: the read past it would find nothing
    if parts:
        yield [b"".join(parts)]


def _batches(
    handle: Iterable[bytes],
    damage: DamageReport,
    known_events: frozenset[str] | None,
    seen: set[int],
    tail_info: list[int] | None,
    offset: int,
    min_seq: int,
    file: str,
    span: tuple[int, int] = (0, 0),
    first_of: Callable[[], int] | None = None,
) -> Iterator[list[Entry]]:
    """``span``: the first ``seq`` this read should hold and (a sealed segment's) last,
    0 for the newest read; ``(0, 0)`` checks for no gap. ``first_of`` says the first
    ``seq`` better than ``span`` (a start record), asked only when entries look missing."""
    valid_end = offset
    batch: list[Entry] = []
    damage_from = len(damage.items)
    seen_before = len(seen)
    top = 0
    for line_no, raw in enumerate(handle, start=1):
        start = offset
        offset += len(raw)
        if not raw.endswith(b"\n"):
            damage.add("torn_tail", start, raw, line_no, file)
            break
        fast = _decode_fast(raw)
        decoded = decode_line(raw[:-1]) if fast is None else fast
        if isinstance(decoded, str):  # damaged: decode_line said how
            damage.add(decoded, start, raw, line_no, file)
            continue
        valid_end = offset
        seq = decoded["seq"]
        if seq in seen or seq <= min_seq:
            damage.add("duplicate_seq", start, raw, line_no, file)
            continue
        seen.add(seq)
        if seq > top:
            top = seq
        if known_events is not None and decoded.get("event") not in known_events:
            damage.unknown_events.append(decoded)
            continue
        batch.append(decoded)
        if len(batch) == BATCH_LINES:
            yield batch
            batch = []
    first, last = span
    end = last or top
    if first and end >= first and end - first + 1 > len(seen) - seen_before:
        # rare: some seq of the span is not in this file (the writer leaves no hole)
        if first_of is not None:
            first = first_of()
        hidden = sum(
            1
            for d in damage.items[damage_from:]
            if d.kind not in _NOT_A_LINE and (last or d.offset < valid_end)
        )
        if first:
            _check_gaps(damage, seen, first, end, hidden, file)
    yield batch
    if tail_info is not None:
        tail_info[:] = [valid_end]


def describe_gaps(gaps: Iterable[tuple[int, int] | list[int]], *, shown: int = 10) -> str:
    """``entry 5 is missing`` / ``entries 5, 8-9 are missing``, of ``[first, last]`` ranges."""
    ranges = [(int(r[0]), int(r[1])) for r in gaps]
    count = sum(last - first + 1 for first, last in ranges)
    text = ", ".join(f"{a}-{b}" if b > a else str(a) for a, b in ranges[:shown])
    text += " ..." if len(ranges) > shown else ""
    return f"entry {text} is missing" if count == 1 else f"entries {text} are missing"


def _check_gaps(
    damage: DamageReport, seen: set[int], first: int, last: int, hidden: int, file: str
) -> None:
    """Report the ``seq`` ranges from ``first`` to ``last`` not in ``seen``, unless the
    ``hidden`` damaged lines among them may hold them all."""
    present = sorted(s for s in seen if first <= s <= last)
    holes: list[tuple[int, int]] = []
    expected = first
    for seq in [*present, last + 1]:
        if seq > expected:
            holes.append((expected, seq - 1))
        expected = seq + 1
    if sum(b - a + 1 for a, b in holes) <= hidden:
        return
    for a, b in holes:
        damage.add_gap(a, b, file)


def history_batches(
    path: str | os.PathLike[str],
    damage: DamageReport,
    known_events: frozenset[str] | None,
    seen: set[int],
    tail_info: list[int] | None,
    sealed: list[Segment] | None = None,
) -> Iterator[list[Entry]]:
    """The whole history: the sealed segments of ``path`` (``sealed``, or listed now),
    then the active file itself.

    A segment missing between two others is damage (``missing_segment``): the
    entries it held are lost. A history that starts after seq 1 is not: a
    compaction policy that deletes old segments leaves exactly that. Entries
    missing inside a file are a ``seq_gap`` (see the module docstring).
    """
    expected = 0
    if sealed is None:
        sealed = list_sealed(path)
    for segment in sealed:
        if expected and segment.first > expected:
            damage.add_gap(expected, segment.first - 1, segment.name, "missing_segment")
        elif expected and segment.first != expected:  # overlapping names: not a gap
            damage.add("missing_segment", 0, b"", 0, segment.name)
        expected = segment.last + 1
        try:
            handle = open_segment(segment)
        except FileNotFoundError:
            damage.add_gap(segment.first, segment.last, segment.name, "missing_segment")
            continue
        with handle:
            span = (segment.first, segment.last)
            yield from _batches(handle, damage, known_events, seen, None, 0, 0, segment.name, span)
            _note_archive_damage(handle, damage, segment)
    first = expected or _FROM_START_RECORD
    if expected:
        hole = missing_before_active(sealed, active_start(path, sealed))
        if hole is not None:  # the newest sealed segments removed: their entries are lost
            damage.add_gap(*hole, START_NAME, "missing_segment")
            first = hole[1] + 1
    yield from entry_batches(path, damage, known_events, seen, tail_info, first_seq=first)


def _note_archive_damage(handle: object, damage: DamageReport, segment: Segment) -> None:
    """An archive whose compressed data stopped reading before its end (``damaged_archive``):
    the entries after the damage are lost, and the span check has reported them missing."""
    why = archive_damage(handle)
    if why is not None:
        # the partial line the damage cut is this damage, not a torn tail to truncate
        damage.items[:] = [
            d for d in damage.items if d.kind != "torn_tail" or d.file != segment.name
        ]
        damage.add(DAMAGED_ARCHIVE, 0, why.encode(), 0, segment.name)


_FROM_START_RECORD = -1
"""``first_seq`` of a log with no sealed segment: 1, unless its start record says more."""


def _start_of(path: str | os.PathLike[str]) -> int:
    """Where a log with no sealed segment starts: its start record says, or entry 1."""
    try:
        return read_start(path) or 1
    except StartUnreadable:
        return 0  # fsck reports the record; nothing says where the log starts


def read_log(
    path: str | os.PathLike[str],
    *,
    known_events: frozenset[str] | None = KNOWN_EVENTS,
    sealed: list[Segment] | None = None,
) -> LogRead:
    """Read a whole log. Never raises on damage; see :func:`iter_log`. ``sealed``: its
    segments as :func:`~substrat.segments.list_sealed` gave them just now."""
    damage = DamageReport()
    tail: list[int] = [0]
    entries: list[Entry] = []
    for batch in history_batches(path, damage, known_events, set(), tail, sealed):
        entries.extend(batch)
    return LogRead(entries, damage, tail[0])


def sealed_batches(
    path: str | os.PathLike[str],
    start: Position,
    damage: DamageReport,
    known_events: frozenset[str] | None,
    seen: set[int],
    min_seq: int,
) -> Iterator[list[Entry]]:
    """The entries of the sealed segments of ``path`` from ``start`` on (not the active file).

    ``start`` is a position in one of them (a checkpoint's end); nothing is
    read when it is in the active file.
    """
    expected = 0
    for segment in list_sealed(path):
        if segment.first < start.file_first:
            continue
        if expected and segment.first != expected:
            damage.add("missing_segment", 0, b"", 0, segment.name)
        expected = segment.last + 1
        offset = start.offset if segment.first == start.file_first else 0
        first = max(segment.first, min_seq + 1)
        with open_segment(segment) as handle:
            if offset:
                handle.read(offset) if segment.archived else handle.seek(offset)
            yield from _batches(
                handle,
                damage,
                known_events,
                seen,
                None,
                offset,
                min_seq,
                segment.name,
                (first, segment.last),
            )
            _note_archive_damage(handle, damage, segment)


def segment_entries(segment: Segment, min_seq: int = 0) -> list[Entry]:
    """The healthy entries of one sealed segment with a ``seq`` above ``min_seq``."""
    out: list[Entry] = []
    with open_segment(segment) as handle:
        for batch in _batches(
            handle, DamageReport(), KNOWN_EVENTS, set(), None, 0, min_seq, segment.name
        ):
            out.extend(batch)
    return out
