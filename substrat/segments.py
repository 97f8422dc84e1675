"""A log as a sequence of segments: sealed ones (plain or archived) and the active file.

An endpoint's log is ``events.jsonl`` (the active segment, the only one
appended to) preceded by sealed segments in the same directory, named by the
first and last ``seq`` they hold::

    agents/<session-id>/events.00000000000000000001-00000000000000004096.jsonl
    agents/<session-id>/events.00000000000000004097-00000000000000008190.jsonl.gz
    agents/<session-id>/events.jsonl            (seq 8191 on)

Reading the whole history reads the sealed segments in order, then the active
file; an archived segment (``.gz``) is read through :mod:`gzip`. Nothing here
decides *when* to roll or archive (see :mod:`substrat.checkpointer`);
this module only says how, durably, through :mod:`substrat.persistence`:

* **roll** (seal the active file): what the file shows is made durable first
  (an open's repair cuts a damaged tail without an fsync, and nothing repairs a
  sealed segment), then ``events.jsonl`` is renamed to its sealed
  name in the same directory (one directory fsync makes it atomic: a crash
  leaves the old name or the new one, never both), then a new empty
  ``events.jsonl`` is created durably. A crash between the two leaves no
  active file; opening the log creates it and numbers on from the last sealed
  segment.
* **start record**: once the roll is done, ``events.start`` beside the log (one
  checksummed line in the log format, event ``log.start``, written atomically)
  says which entry the new active file starts at. Segment names say it too,
  but only while a sealed segment is there: with every one of them removed by
  hand, the active file alone cannot tell "entries 1..N-1 are gone" from "its
  first lines were damaged" (a damaged line costs only itself). The record
  tells (:func:`active_start`). It is written after the rename, never before
  (a record ahead of the active file would claim entries lost that are there);
  a crash in between leaves it missing or naming an older start, which only
  weakens what a reader knows while the names still say it, and every open
  of the log for appending writes it again then (:func:`ensure_start`). A
  root from before the record reads as before until its next roll.
* **archive**: the compressed copy is written atomically (temp file, fsync,
  rename, directory fsync) and only then is the plain segment removed
  (durably). A crash between leaves both, identical in content; readers take
  the plain one and the next compaction removes it.
"""

from __future__ import annotations

import gzip
import io
import os
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from substrat import paths, persistence
from substrat.events import LOG_START
from substrat.logline import RecordUnreadable, encode_entry, read_record

ACTIVE_NAME = "events.jsonl"
START_NAME = "events.start"
START_FORMAT = 1
ARCHIVE_SUFFIX = ".gz"
GZIP_LEVEL = 6
_SEALED = re.compile(r"events\.([0-9]{20})-([0-9]{20})\.jsonl(\.gz)?")


def is_segment_name(name: str) -> bool:
    """Whether ``name`` is a sealed segment's file name (plain or archived)."""
    return _SEALED.fullmatch(name) is not None


def sealed_name(first: int, last: int, *, archived: bool = False) -> str:
    assert 1 <= first <= last, (first, last)
    return f"events.{first:020d}-{last:020d}.jsonl" + (ARCHIVE_SUFFIX if archived else "")


# A NamedTuple, not a frozen dataclass: every daemon defines it (see rpc.lock.LockInfo)
class Segment(NamedTuple):
    """One sealed segment: entries ``first`` to ``last`` (by ``seq``), plain or archived."""

    first: int
    last: int
    path: Path

    @property
    def archived(self) -> bool:
        return self.path.name.endswith(ARCHIVE_SUFFIX)

    @property
    def name(self) -> str:
        return self.path.name


def list_sealed(log_path: str | os.PathLike[str]) -> list[Segment]:
    """The sealed segments before the active file ``log_path``, oldest first.

    When a segment is there both plain and archived (a crash between writing
    the archive and removing the plain file), the plain one is listed.
    """
    directory = os.path.dirname(paths.text(log_path))
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return _sealed_of(directory, names)


def list_log(log_path: str | os.PathLike[str]) -> tuple[list[Segment], frozenset[str]]:
    """:func:`list_sealed`, and every name in the log's directory (none if it is gone):
    a reader that has them need not look for the log's other files one by one (the
    start record, the pending entry: most logs have neither)."""
    directory = os.path.dirname(paths.text(log_path))
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return [], frozenset()
    return _sealed_of(directory, names), frozenset(names)


def _sealed_of(directory: str, names: list[str]) -> list[Segment]:
    found: dict[int, Segment] = {}
    for name in names:
        if not name.startswith("events.0"):  # most names (a restart lists every log)
            continue
        match = _SEALED.fullmatch(name)
        if match is None:
            continue
        first, last = int(match.group(1)), int(match.group(2))
        if first < 1 or last < first:
            continue
        known = found.get(first)
        if known is None or (known.archived and match.group(3) is None):
            found[first] = Segment(first, last, Path(directory, name))
    return [found[first] for first in sorted(found)]


def active_first(sealed: list[Segment]) -> int:
    """The ``seq`` the active file starts at: one past the last sealed segment."""
    return sealed[-1].last + 1 if sealed else 1


class StartUnreadable(ValueError):
    """The start record is there but does not read (damaged)."""


class StartNotWritten(OSError):
    """:func:`roll` sealed the active file into ``segment`` (the rename and the new
    active file are durable) but writing the start record after it failed: nothing is
    lost, readers take the active file's first entry from the segments' names, and the
    next open of the log for appending writes the record (:func:`ensure_start`)."""

    def __init__(self, segment: Segment, cause: OSError) -> None:
        super().__init__(
            f"sealed {segment.name}, but writing the start record after it failed ({cause}); "
            "nothing is lost: the log reads without it, and its next append writes it"
        )
        self.segment = segment


_SIBLINGS_KEPT = 1024
_siblings: dict[tuple[str, str], Path] = {}


def sibling_path(log_path: str | os.PathLike[str], name: str) -> Path:
    """The file ``name`` beside the log's active file (kept: recovery, the checks and
    every roll ask for the same few, and each new Path is parsed and formatted again)."""
    key = (paths.text(log_path), name)
    path = _siblings.get(key)
    if path is None:
        if len(_siblings) >= _SIBLINGS_KEPT:
            _siblings.clear()
        path = _siblings[key] = Path(key[0]).with_name(name)
    return path


def start_path(log_path: str | os.PathLike[str]) -> Path:
    return sibling_path(log_path, START_NAME)


def read_start(log_path: str | os.PathLike[str]) -> int | None:
    """The entry the log's active file starts at, as its start record says; None
    without a record, StartUnreadable for one that does not read."""
    try:
        entry = read_record(start_path(log_path), LOG_START)
    except RecordUnreadable as exc:
        raise StartUnreadable(str(exc)) from None
    if entry is None:
        return None
    data = entry.get("data")
    if (
        type(data) is not dict
        or data.get("format") != START_FORMAT
        or type(data.get("first")) is not int
        or data["first"] < 1
    ):
        raise StartUnreadable(f"{start_path(log_path)} is not a start record this version reads")
    return int(data["first"])


def write_start(log_path: str | os.PathLike[str], first: int) -> None:
    """Record durably that the active file starts at entry ``first`` (atomically)."""
    assert first >= 1, first
    line = encode_entry(
        {"seq": first, "event": LOG_START, "data": {"format": START_FORMAT, "first": first}}
    )
    persistence.atomic_write(start_path(log_path), line)


def ensure_start(log_path: str | os.PathLike[str], sealed: list[Segment]) -> None:
    """Write the start record if the sealed segments' names say more than it does
    (missing, damaged, or older: a crash cut a roll short, or a root from before the
    record). Nothing to do for a log never sealed."""
    if not sealed:
        return
    first = active_first(sealed)
    try:
        recorded = read_start(log_path)
    except StartUnreadable:
        recorded = None
    if recorded is None or recorded < first:
        if os.path.lexists(start_path(log_path)) and not os.path.isfile(start_path(log_path)):
            # a directory in its place: while the names say it, the log works without
            # it, and what is there is not ours to remove (fsck reports it, --repair
            # moves it to quarantine/ and writes the record)
            return
        write_start(log_path, first)


def active_start(
    log_path: str | os.PathLike[str], sealed: list[Segment], names: frozenset[str] | None = None
) -> int:
    """The ``seq`` the active file starts at: one past the last sealed segment, or what
    the start record says if that is further (1 without either; a record that does not
    read is not used: fsck reports it). ``names``: the directory's, as :func:`list_log`
    gave them with ``sealed`` (the record is not looked for when they lack it).

    The record is only ever ahead of the segments' names when the newest sealed
    segments were removed (compaction never removes the newest): their entries are
    lost (:func:`missing_before_active`), and their seqs are never used again.
    """
    first = active_first(sealed)
    if names is not None and START_NAME not in names:
        return first
    try:
        recorded = read_start(log_path)
    except StartUnreadable:
        recorded = None
    return first if recorded is None else max(first, recorded)


def missing_before_active(sealed: list[Segment], first_active: int) -> tuple[int, int] | None:
    """The entries between the last sealed segment and the active file (``first`` and
    ``last`` seq), when the start record says the active file starts past the segments:
    sealed segments removed by hand after the last one left. None when nothing is missing
    there (a log with no sealed segment left is a missing prefix instead)."""
    if not sealed or first_active <= sealed[-1].last + 1:
        return None
    return sealed[-1].last + 1, first_active - 1


class SegmentDamaged(Exception):
    """An archived segment's compressed data does not read to its end (truncated or
    corrupt): what came before the damage reads, the rest is lost."""


_GZIP_ERRORS = (EOFError, gzip.BadGzipFile, zlib.error)
_ARCHIVE_BUFFER = 1 << 16


class _ArchiveRaw(io.RawIOBase):
    """An archived segment's decompressed bytes, ending where its compressed data stops
    reading (a truncated or corrupt ``.gz``) instead of raising there: what came before
    is read as usual, and ``damage`` says what stopped it. A reader that has read to the
    end asks :func:`archive_damage`; raising would cost every entry of the log (and,
    uncaught, the command or the daemon's request) for what costs this file's tail.
    Wrapped in a :class:`io.BufferedReader` (:func:`open_segment`), so lines are split
    in C, not by a Python ``readline`` per line."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__()
        self._gzip = gzip.GzipFile(path, "rb")
        self.damage: str | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self.damage is not None:
            return 0
        try:
            data = self._gzip.read1(len(buffer))
        except _GZIP_ERRORS as exc:
            self.damage = str(exc) or type(exc).__name__
            return 0
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        opened = getattr(self, "_gzip", None)  # None: the open itself failed
        if opened is not None:
            opened.close()
        super().close()


def _open_archive(path: str | os.PathLike[str]) -> io.BufferedReader:
    return io.BufferedReader(_ArchiveRaw(path), _ARCHIVE_BUFFER)


def archive_damage(handle: object) -> str | None:
    """What stopped a reader from :func:`open_segment` before the end of an archived
    segment's data (None: nothing, or not an archive)."""
    raw = getattr(handle, "raw", None)
    return raw.damage if isinstance(raw, _ArchiveRaw) else None


def open_segment(segment: Segment) -> io.BufferedIOBase:
    """A binary reader of the segment's lines (decompressed if archived; a damaged
    archive's reader ends at the damage, see :func:`archive_damage`).

    A plain segment that an archive has just replaced (its removal raced this
    open) is read from the archive instead.
    """
    if segment.archived:
        return _open_archive(segment.path)
    try:
        return open(segment.path, "rb")
    except FileNotFoundError:
        twin = segment.path.with_name(segment.path.name + ARCHIVE_SUFFIX)
        return _open_archive(twin)


def read_segment(segment: Segment) -> bytes:
    """The segment's bytes (decompressed); raises :class:`SegmentDamaged` for an
    archive that does not read to its end (a caller rewriting it would lose its tail)."""
    with open_segment(segment) as handle:
        data = handle.read()
        damage = archive_damage(handle)
    if damage is not None:
        raise SegmentDamaged(f"{segment.path}: {damage}")
    return data


def roll(log_path: str | os.PathLike[str], first: int, last: int) -> Segment:
    """Seal the active file (entries ``first``..``last``) and start an empty one, durably,
    then record where it starts (see the module docstring).

    The caller has closed every writer of ``log_path``.
    """
    active = Path(log_path)
    target = active.with_name(sealed_name(first, last))
    # What the file shows may not be durable: an open's repair cuts a damaged tail
    # without an fsync, leaving that to the next append's, and a sealed file gets
    # neither an append nor a repair (only the active file is repaired). Renamed as
    # it is, a power loss would bring the cut tail back inside the segment.
    persistence.durable_contents(active)
    persistence.durable_rename(active, target)
    persistence.durable_create(active)
    sealed = Segment(first, last, target)
    try:
        write_start(active, last + 1)  # after the rename: never ahead of the active file
    except OSError as exc:
        raise StartNotWritten(sealed, exc) from exc
    return sealed


def archive(segment: Segment) -> Segment:
    """Replace a plain sealed segment by its gzip copy, durably (see the module docstring)."""
    if segment.archived:
        return segment
    target = segment.path.with_name(segment.path.name + ARCHIVE_SUFFIX)
    if not os.path.exists(target):
        data = persistence.read_bytes(segment.path)
        # mtime=0: the same segment always compresses to the same bytes
        persistence.atomic_write(target, gzip.compress(data, GZIP_LEVEL, mtime=0))
    persistence.durable_unlink(segment.path)
    return Segment(segment.first, segment.last, target)


def history_files(log_path: str | os.PathLike[str]) -> Iterator[tuple[Segment | None, Path]]:
    """Every file of the log in order: the sealed segments, then the active file (None)."""
    for segment in list_sealed(log_path):
        yield segment, segment.path
    yield None, Path(log_path)


def stored_bytes(log_path: str | os.PathLike[str]) -> int:
    """Bytes the log takes on disk: its sealed segments (as stored) and the active file."""
    total = 0
    for _, path in history_files(log_path):
        try:
            total += os.stat(path).st_size
        except FileNotFoundError:
            continue
    return total


# A NamedTuple, not a frozen dataclass: every daemon defines it (see rpc.lock.LockInfo)
class Position(NamedTuple):
    """A byte position in a log: ``offset`` in the file whose first entry is ``file_first``.

    Files are named by where they start, so a position stays valid when the
    active file it was taken in is sealed.
    """

    file_first: int
    offset: int


class PositionGone(LookupError):
    """The file a position names is not in the log any more (deleted, or never there)."""


def raw_lines(
    log_path: str | os.PathLike[str],
    start: Position | None = None,
    *,
    active_end: int | None = None,
) -> Iterator[tuple[int, int, bytes]]:
    """``(file_first, offset, line)`` for every line after ``start`` (all of them if None).

    Lines keep their newline; a last line without one (a torn tail) is yielded
    as it is. In the active file only bytes before ``active_end`` are read (a
    writer may be appending after it). Raises :class:`PositionGone` when the
    file ``start`` names does not exist.
    """
    sealed = list_sealed(log_path)
    first_active = active_start(log_path, sealed)
    files: list[tuple[int, Segment | None]] = [(s.first, s) for s in sealed]
    files.append((first_active, None))
    if start is not None:
        at = [i for i, (first, _) in enumerate(files) if first == start.file_first]
        if not at:
            raise PositionGone(f"{log_path}: no segment starts at seq {start.file_first}")
        files = files[at[0] :]
    for index, (first, segment) in enumerate(files):
        offset = start.offset if start is not None and index == 0 else 0
        if segment is None:
            try:
                handle: io.BufferedIOBase = open(log_path, "rb")
            except FileNotFoundError:
                return
        else:
            handle = open_segment(segment)
        with handle:
            if offset:
                if segment is None or not segment.archived:
                    handle.seek(offset)
                else:  # a gzip stream seeks by reading
                    handle.read(offset)
            limit = None if segment is not None else active_end
            for raw in handle:
                if limit is not None and offset + len(raw) > limit:
                    break
                yield first, offset, raw
                offset += len(raw)
