"""Checkpoints: what recovery derives from a log up to a ``seq``, so a restart reads only the rest.

A checkpoint of one endpoint's log (an agent's, or the user's) is the
:class:`~substrat.facts.AgentFacts` of the log's prefix up to entry ``seq``,
compacted (:meth:`~substrat.facts.AgentFacts.forget`), together with where that
prefix ends (:class:`LogPoint`): the file holding entry ``seq`` (named by its
first seq, so sealing the file does not move it), the entry's offset, length
and own CRC, and the length and CRC-32 of the whole prefix.

Checkpoints of every endpoint live in one store per root,
``<root>/checkpoints/events.jsonl``: the log format of every other log (one
checksummed line per checkpoint, event ``checkpoint``), appended in batches and
fsynced, a torn tail cut when it is opened. A restart reads that one file
instead of every log; per endpoint the newest checkpoint counts, and the one
before it is kept as a fallback.

**Trust, but verify.** Recovery uses a checkpoint only after checking it
against its log (:func:`verify`): the file it names must exist and hold, at the
offset it names, a valid entry with its ``seq`` and its CRC. Anything else (the
store or the line torn, damaged or gone, the log shorter than the checkpoint,
rewritten, or another log's) and recovery reads the log from its start, and
says so in its report (``checkpoints_rejected``). A checkpoint can make a
restart faster; it can never make it wrong.

**Written after what it covers.** A checkpoint is built from entries that are
already durable (it covers at most what :meth:`EventLog.log` has returned) and
whose turns are settled (their effects applied, see :mod:`substrat.checkpointer`);
compaction acts only on checkpoints whose append returned (fsynced).
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from substrat import events, jsontext, paths, persistence
from substrat.errors import DurabilityError
from substrat.eventlog import LOG_NAME, Clock, decode_line, encode_entry, utc_now_iso
from substrat.facts import AgentFacts
from substrat.logread import file_lines, open_sized
from substrat.segments import (
    Position,
    PositionGone,
    Segment,
    active_start,
    archive_damage,
    list_sealed,
    open_segment,
    raw_lines,
)

CHECKPOINTS_DIR = "checkpoints"
FORMAT = 2
"""The checkpoint format this version writes: ``facts`` as JSON text, decoded only when
the checkpoint is used (reading the store decodes no facts). Format 1 (``facts`` an
object) is still read; any other is not trusted."""
_READ_FORMATS = (1, FORMAT)
KEEP_PER_ENDPOINT = 2
"""Checkpoints kept per endpoint when the store is rewritten: the newest and its fallback."""
MAX_CHECKPOINT_BYTES = 16 << 20
"""A checkpoint bigger than this (huge pending messages) is not written: that endpoint
is recovered from its previous checkpoint, or its log."""
REWRITE_MIN_BYTES = 4 << 20
"""The store is rewritten (older checkpoints dropped) once it is this big and four
times what it keeps."""


@dataclass(frozen=True, slots=True)
class LogPoint:
    """Where a checkpoint's prefix ends in its log (see the module docstring)."""

    seq: int
    file_first: int
    offset: int
    length: int
    crc: str
    prefix_bytes: int
    prefix_crc: int

    def after(self) -> Position:
        """The position just past the checkpoint's last entry: where its tail starts."""
        return Position(self.file_first, self.offset + self.length)

    def to_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "file_first": self.file_first,
            "offset": self.offset,
            "length": self.length,
            "crc": self.crc,
            "prefix_bytes": self.prefix_bytes,
            "prefix_crc": self.prefix_crc,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LogPoint:
        point = cls(
            seq=int(data["seq"]),
            file_first=int(data["file_first"]),
            offset=int(data["offset"]),
            length=int(data["length"]),
            crc=str(data["crc"]),
            prefix_bytes=int(data["prefix_bytes"]),
            prefix_crc=int(data["prefix_crc"]),
        )
        if min(point.seq, point.file_first, point.length) < 1 or point.offset < 0:
            raise ValueError(f"impossible log point {data!r}")
        return point


@dataclass(frozen=True, slots=True)
class Stored:
    """Where a checkpoint's line is in its store: its facts are read back from there."""

    path: Path
    offset: int
    length: int

    def read_facts(self, checkpoint: Checkpoint) -> str:
        """``checkpoint``'s facts text from its line (ValueError if the line is not it)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                line = os.pread(fd, self.length, self.offset)
            finally:
                os.close(fd)
        except OSError as exc:
            raise ValueError(f"its store cannot be read back: {exc}") from None
        torn = not line.endswith(b"\n")
        entry = "torn_tail" if torn else decode_line(line, len(line) - 1, one_string=True)
        if isinstance(entry, str):
            raise ValueError(f"its line in the store no longer reads ({entry})")
        again = Checkpoint.from_data(entry.get("data"))
        if again.endpoint != checkpoint.endpoint or again.at != checkpoint.at:
            raise ValueError("its line in the store holds another checkpoint")
        assert again.text is not None
        return again.text


@dataclass(slots=True)
class Checkpoint:
    """One endpoint's checkpoint: its facts up to ``at.seq``, as JSON text (see
    :meth:`load_facts`).

    A checkpoint written to the store, or used by a restart, keeps only where
    its line is (``stored``), not its text: a root of 10,000 agents holds
    megabytes of facts, and the checkpointer reads one back only when it builds
    on it.
    """

    endpoint: str
    at: LogPoint
    text: str | None = field(default=None, repr=False)
    stored: Stored | None = None

    @property
    def facts(self) -> str:
        """Its facts as JSON text, read back from the store if not held (ValueError if
        they cannot be)."""
        if self.text is not None:
            return self.text
        if self.stored is None:
            raise ValueError("a checkpoint without facts")
        return self.stored.read_facts(self)

    def held(self) -> Checkpoint:
        """A copy that holds its facts text, whatever happens to the store after."""
        return Checkpoint(self.endpoint, self.at, self.facts)

    def release(self, stored: Stored | None = None) -> None:
        """Its line is at ``stored`` (or where it was read from): keep that instead of the
        text."""
        if stored is not None:
            self.stored = stored
        if self.stored is not None:
            self.text = None

    def data(self) -> dict[str, Any]:
        """The ``data`` of its ``checkpoint`` entry in the store."""
        return {
            "format": FORMAT,
            "endpoint": self.endpoint,
            "at": self.at.to_dict(),
            "facts": self.facts,
        }

    @classmethod
    def from_data(cls, data: Any) -> Checkpoint:
        """A checkpoint from its entry's ``data``; ValueError if it is not one this reads."""
        if type(data) is not dict or data.get("format") not in _READ_FORMATS:
            raise ValueError("not a checkpoint of a format this version reads")
        try:
            endpoint = str(data["endpoint"])
            at = LogPoint.from_dict(data["at"])
            facts = data["facts"]
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"checkpoint fields: {exc!r}") from None
        if data["format"] == 1 and type(facts) is dict:
            facts = orjson.dumps(facts).decode()
        if type(facts) is not str:
            raise ValueError("checkpoint facts are not JSON text")
        return cls(endpoint, at, facts)

    def load_facts(self) -> AgentFacts:
        """Its facts, decoded now (ValueError if they do not read, or its line in the store
        no longer holds it)."""
        try:
            data = jsontext.loads(self.facts)
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"checkpoint facts are not JSON: {exc}") from None
        if type(data) is not dict:
            raise ValueError("checkpoint facts are not an object")
        return AgentFacts.from_dict(self.endpoint, data)


# -- verifying against the log -----------------------------------------------------------


def verify(
    checkpoint: Checkpoint,
    log_path: str | os.PathLike[str],
    sealed: list[Segment] | None = None,
    first_active: int | None = None,
) -> str | None:
    """Check ``checkpoint`` against its log: None if it holds, else why not.

    Holds when the file it names is in the log and has, at the offset it
    names, a valid entry with its ``seq`` and CRC (so the log still has the
    prefix it summarises, byte for byte at that line). ``sealed`` is the log's
    :func:`~substrat.segments.list_sealed`, and ``first_active`` its
    :func:`~substrat.segments.active_start`, if the caller has them already.
    """
    at = checkpoint.at
    if sealed is None:
        sealed = list_sealed(log_path)
    segment = next((s for s in sealed if s.first == at.file_first), None)
    try:
        if segment is not None:
            with open_segment(segment) as handle:
                handle.read(at.offset) if segment.archived else handle.seek(at.offset)
                line = handle.read(at.length)
                damaged = archive_damage(handle)
            if damaged is not None and len(line) < at.length:
                return f"its segment {segment.name} does not read that far ({damaged})"
        elif at.file_first == (
            active_start(log_path, sealed) if first_active is None else first_active
        ):
            fd = os.open(log_path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                line = os.pread(fd, at.length, at.offset)
            finally:
                os.close(fd)
        else:
            return f"the segment starting at seq {at.file_first} is not in the log"
    except FileNotFoundError:
        return "its log is gone"
    return line_mismatch(at, line)


LOG_SHORTER = "the log ends before entry"
"""How a reason starts when the log is shorter than its checkpoint: it lost durable entries."""
_CRC_OF_OPEN_BRACE = zlib.crc32(b"{")
_BODY_START = len(b'{"crc":"00000000",')


def line_mismatch(at: LogPoint, line: bytes) -> str | None:
    """Whether ``line``, read where ``at`` says its entry is (``at.length`` bytes at
    ``at.offset`` of its file), is that entry: None if it is, else why not.

    The entry is that line when its checksum holds and is ``at.crc``, and it starts
    with ``at.seq`` as substrat writes it (``seq`` first): that is checked without
    decoding the line (a restart checks one line per agent). Anything else is
    decoded, to say what is there.
    """
    if _is_the_line(at, line):
        return None
    if len(line) < at.length or not line.endswith(b"\n"):
        return f"{LOG_SHORTER} {at.seq} (it is shorter than the checkpoint)"
    entry = decode_line(line[:-1])
    if isinstance(entry, str):
        return f"no valid entry where entry {at.seq} was ({entry})"
    if entry["seq"] != at.seq or line[8:16].decode("ascii", "replace") != at.crc:
        return f"the entry where entry {at.seq} was is a different one (seq {entry['seq']})"
    return None


def _is_the_line(at: LogPoint, line: bytes) -> bool:
    prefix = b'{"crc":"%s","seq":%d,' % (at.crc.encode("ascii", "replace"), at.seq)
    if len(line) != at.length or not line.endswith(b"\n") or not line.startswith(prefix):
        return False
    try:
        expected = int(line[8:16], 16)
    except ValueError:
        return False
    return zlib.crc32(memoryview(line)[_BODY_START:-1], _CRC_OF_OPEN_BRACE) == expected


# -- building --------------------------------------------------------------------------


@dataclass
class Settled:
    """What the orchestrator vouches for when a checkpoint is built (see
    :meth:`~substrat.facts.AgentFacts.forget`)."""

    turns: Mapping[str, int] = field(default_factory=dict)
    """Each live agent -> the turn up to which all its turns' effects are applied."""
    strict: bool = False
    """Some agent is held back: an agent missing from ``turns`` may still be alive."""


def build(
    endpoint: str,
    log_path: str | os.PathLike[str],
    previous: Checkpoint | None,
    *,
    upto_seq: int,
    active_end: int,
    settled: Settled,
) -> Checkpoint | None:
    """The checkpoint of ``log_path`` up to entry ``upto_seq``, from ``previous`` on.

    Reads only what follows ``previous`` (the whole log without one), and in
    the active file only its first ``active_end`` bytes (its durable part).
    Every committed turn up to ``upto_seq`` must be settled (see
    :class:`Settled`). None when there is nothing new to cover.
    Raises ValueError if ``previous`` does not read, PositionGone if its file
    left the log.
    """
    facts = AgentFacts(endpoint) if previous is None else previous.load_facts()
    ceiling = facts.ceiling()
    prefix_bytes = 0 if previous is None else previous.at.prefix_bytes
    prefix_crc = 0 if previous is None else previous.at.prefix_crc
    floor = 0 if previous is None else previous.at.seq
    start = None if previous is None else previous.at.after()
    seen: set[int] = set()
    damage: dict[str, int] = {}
    last: LogPoint | None = None
    for file_first, offset, raw in raw_lines(log_path, start, active_end=active_end):
        if start is None and last is None and file_first > 1:
            # its first segments were deleted: only a checkpoint can say what they held
            raise ValueError(f"{log_path}: entries before {file_first} are not in the log")
        if not ceiling.feed(raw):
            break  # a partial line: never durable
        decoded = decode_line(raw[:-1])
        if not isinstance(decoded, str) and decoded["seq"] > upto_seq:
            break
        prefix_bytes += len(raw)
        prefix_crc = zlib.crc32(raw, prefix_crc)
        if isinstance(decoded, str) or decoded["seq"] <= floor or decoded["seq"] in seen:
            kind = decoded if isinstance(decoded, str) else "duplicate_seq"
            damage[kind] = damage.get(kind, 0) + 1
            continue
        seen.add(decoded["seq"])
        if decoded.get("event") in events.KNOWN_EVENTS:
            facts.add(decoded)
        else:
            damage["unknown_event"] = damage.get("unknown_event", 0) + 1
        for kind, count in damage.items():
            facts.damage[kind] = facts.damage.get(kind, 0) + count
        damage = {}
        facts.highest_turn, facts.damaged_after = ceiling.highest, ceiling.damaged_after
        last = LogPoint(
            decoded["seq"],
            file_first,
            offset,
            len(raw),
            raw[8:16].decode("ascii"),
            prefix_bytes,
            prefix_crc,
        )
    if last is None:
        return None
    facts.forget(settled.turns, strict=settled.strict)
    return Checkpoint(endpoint, last, orjson.dumps(facts.to_dict()).decode())


# -- the store -------------------------------------------------------------------------


def store_path(root: str | os.PathLike[str]) -> Path:
    return paths.under(root, CHECKPOINTS_DIR, LOG_NAME)


@dataclass
class StoreRead:
    """What the store holds: per endpoint its checkpoints, newest last."""

    checkpoints: dict[str, list[Checkpoint]] = field(default_factory=dict)
    damage: dict[str, int] = field(default_factory=dict)
    problem: str | None = None
    """Why the store could not be read at all (then every log is read in full)."""
    last_seq: int = 0
    valid_end: int = 0
    size: int = 0

    def latest(self, endpoint: str) -> list[Checkpoint]:
        """The endpoint's checkpoints, newest first."""
        return list(reversed(self.checkpoints.get(endpoint, [])))

    def newest(self, endpoint: str) -> Checkpoint | None:
        """The endpoint's newest checkpoint, if it has one."""
        kept = self.checkpoints.get(endpoint)
        return kept[-1] if kept else None

    def kept_bytes(self) -> int:
        return sum(len(_line(c, 0)) for items in self.checkpoints.values() for c in items)


def read_store(root: str | os.PathLike[str]) -> StoreRead:
    """Read every checkpoint in the store; damage costs only the damaged lines."""
    read = StoreRead()
    path = store_path(root)
    try:
        fd, size = open_sized(path)  # no file object: lines as a log's (substrat.logread)
    except FileNotFoundError:
        return read
    except OSError as exc:
        read.problem = f"{path}: {exc}"
        return read
    offset = 0
    try:
        for raw in file_lines(fd, 0, size):
            start = offset
            offset += len(raw)
            if not raw.endswith(b"\n"):
                read.damage["torn_tail"] = read.damage.get("torn_tail", 0) + 1
                break
            entry = decode_line(raw[:-1])
            if isinstance(entry, str):
                read.damage[entry] = read.damage.get(entry, 0) + 1
                continue
            read.valid_end = offset
            read.last_seq = max(read.last_seq, int(entry["seq"]))
            if entry.get("event") != events.CHECKPOINT:
                continue
            try:
                checkpoint = Checkpoint.from_data(entry.get("data"))
            except ValueError:
                read.damage["unreadable_checkpoint"] = (
                    read.damage.get("unreadable_checkpoint", 0) + 1
                )
                continue
            # the text stays until the checkpoint is used (a restart decodes it then, and
            # releases it: see Checkpoint.release); the other checkpoints go with the read
            checkpoint.stored = Stored(path, start, len(raw))
            kept = read.checkpoints.setdefault(checkpoint.endpoint, [])
            kept.append(checkpoint)
            del kept[:-KEEP_PER_ENDPOINT]
    finally:
        os.close(fd)
    read.size = offset
    return read


def _line(checkpoint: Checkpoint, seq: int, clock: Clock = utc_now_iso) -> bytes:
    return encode_entry(
        {
            "seq": seq,
            "endpoint": CHECKPOINTS_DIR,
            "ts": clock(),
            "event": events.CHECKPOINT,
            "data": checkpoint.data(),
        }
    )


def encode_store(checkpoints: list[Checkpoint], clock: Clock = utc_now_iso) -> bytes:
    """A whole store holding ``checkpoints`` (each endpoint's newest last), as bytes."""
    return b"".join(_line(c, seq, clock) for seq, c in enumerate(checkpoints, start=1))


class CheckpointStore:
    """The root's checkpoint store, appended to in batches (see the module docstring).

    Not thread-safe: one writer (the checkpointer) at a time.
    """

    def __init__(self, root: str | os.PathLike[str], *, clock: Clock = utc_now_iso) -> None:
        self.path = store_path(root)
        self._clock = clock
        self.make_dir: Callable[[Path], object] = persistence.durable_mkdir
        """Makes its directory durable: the orchestrator's is its SessionStore.make_dir."""
        self._fd: int | None = None
        self._next_seq = 1
        self._end = 0
        self.broken: str | None = None
        """Why this store takes no more checkpoints (an I/O error); recovery is unaffected."""

    def _open(self) -> int:
        if self._fd is not None:
            return self._fd
        self.make_dir(self.path.parent)
        if not os.path.exists(self.path):
            persistence.durable_create(self.path)
        read = read_store(self.path.parent.parent)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        try:
            if os.fstat(fd).st_size > read.valid_end:
                # A torn tail: cut it before appending. Not fsynced, as the event log's
                # cut is not: the cut bytes were never relied on, a crash that brings
                # them back loses nothing (read_store stops before them again), and the
                # next append's fsync makes the cut durable with the line.
                os.ftruncate(fd, read.valid_end)
        except OSError:
            os.close(fd)
            raise
        self._fd, self._next_seq, self._end = fd, read.last_seq + 1, read.valid_end
        return fd

    def append(self, checkpoints: list[Checkpoint]) -> list[Checkpoint]:
        """Append ``checkpoints`` durably (one write, one fsync); returns those written.

        A checkpoint over ``MAX_CHECKPOINT_BYTES`` is left out. On an I/O error
        nothing is written as far as anyone may rely on (DurabilityError is
        raised and the store takes no more checkpoints in this process).
        """
        if self.broken is not None:
            raise DurabilityError(f"the checkpoint store is out of use: {self.broken}")
        lines: list[bytes] = []
        written: list[Checkpoint] = []
        try:
            fd = self._open()
            for checkpoint in checkpoints:
                line = _line(checkpoint, self._next_seq + len(lines), self._clock)
                if len(line) <= MAX_CHECKPOINT_BYTES:
                    lines.append(line)
                    written.append(checkpoint)
            if lines:
                blob = b"".join(lines)
                persistence.write_all(fd, blob)
                persistence.fsync_fd(fd, self.path)
                self._next_seq += len(lines)
                for checkpoint, line in zip(written, lines, strict=True):
                    checkpoint.release(Stored(self.path, self._end, len(line)))
                    self._end += len(line)
        except OSError as exc:
            self.close()
            self.broken = str(exc)
            if isinstance(exc, DurabilityError):
                raise
            raise DurabilityError(f"checkpoint append to {self.path} failed: {exc}") from exc
        return written

    @property
    def size(self) -> int:
        return self._end

    def rewrite(self, keep: dict[str, list[Checkpoint]]) -> None:
        """Replace the store by ``keep`` (each endpoint's newest last), atomically."""
        self.close()
        kept: list[Checkpoint] = []
        lines: list[bytes] = []
        for endpoint in sorted(keep):
            for checkpoint in keep[endpoint][-KEEP_PER_ENDPOINT:]:
                try:  # read back from the store being replaced
                    line = _line(checkpoint, len(lines) + 1, self._clock)
                except ValueError:
                    continue  # its line no longer reads: a restart reads more of that log
                kept.append(checkpoint)
                lines.append(line)
        # No durable_mkdir here: both callers rewrite a store they have just read, so
        # its directory is there, made durable by the _open that created the store.
        persistence.atomic_write(self.path, b"".join(lines))
        offset = 0
        for checkpoint, line in zip(kept, lines, strict=True):
            checkpoint.release(Stored(self.path, offset, len(line)))
            offset += len(line)

    def close(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None


__all__ = [
    "CHECKPOINTS_DIR",
    "Checkpoint",
    "CheckpointStore",
    "LogPoint",
    "PositionGone",
    "Settled",
    "StoreRead",
    "Stored",
    "build",
    "encode_store",
    "line_mismatch",
    "read_store",
    "store_path",
    "verify",
]
