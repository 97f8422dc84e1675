"""The start summary: what a restart needs of each quiet agent, in one file read in one piece.

A root with many live agents spends its start on per-agent work that reads no
history: the checkpoint store's line per agent, the agent's record, the end of
its log, its facts (docs/benchmarks.md, issue 16). The summary,
``<root>/checkpoints/start.json``, holds that work done once, at a clean stop
(:meth:`substrat.checkpointer.Checkpointer.summarize`, after the last
checkpoints are durable and every log is closed). It is derived from the disk
alone (:func:`build`: the store as :func:`~substrat.checkpoints.read_store`
reads it, each record and log as they are), so ``fsck --repair`` rebuilds it
the same way. It holds:

* the store's fingerprint (see below) and where every checkpoint of the store
  is (its :class:`~substrat.checkpoints.LogPoint` and its line's place), so a
  start that finds the same store reads no line of it;
* per agent whose log ends exactly where its newest checkpoint does (never
  sealed, the checkpoint's line checked as a start checks it, writable, no
  pending entry to replay), whose record parses and whose facts are small
  (``MAX_FACTS_BYTES``; the user's inbox and a parent's spawn records stay in
  the store): its record's fields as the record parsed, its log's fingerprint,
  and its facts as a start uses them (without the last completed turn and
  ``session.created``, which a start drops).

**The summary is the authority of a clean stop, and is consumed at the next
open.** Every substrat process that writes to a root retires the summary
durably (:func:`retire`: unlinked, ``checkpoints/`` fsynced) before its first
write: a start (:func:`substrat.recovery.recover`, which every
:meth:`~substrat.orchestrator.Orchestrator.open` runs: the daemon, ``compact``,
the offline commands, a library's open) and ``fsck --repair``
(:func:`substrat.fsck_repair.repair_root`) before anything else; only a clean
stop writes a new one, after its last write (and a repair, from the disk as it
then is). So while a summary exists no substrat process has written to the
root since the clean stop that wrote it, and what it holds of each agent's
record and pending file is what is there: a start checks neither (a file call
an agent each). A crash anywhere after the retirement leaves no summary, so
the next start reads the store and the logs as always (a crash costs speed,
never state). What a start still checks per agent is its log: one ``stat``
gives the fingerprint the entry holds, ``(st_dev, st_ino, st_size,
st_mtime_ns, st_ctime_ns)``, so a log appended to, cut or replaced by hand in a
stopped root (or copied: a new inode) is read as without a summary. A record
edited by hand in a stopped root is not looked at: the start serves the record
the summary holds (``fsck`` says when they differ, and ``--repair`` builds the
summary again from the records). A pending file put beside a log by hand is
never replayed into a log whose agent the summary gave (see
:attr:`substrat.eventlog.Resume.summarized`). The store's fingerprint is
checked the same way: a store not the one summarised makes the whole summary
stale (then the store is read as always).

**Never a wrong state.** The file is checksummed (its first line holds the
CRC-32 and length of the rest). A summary missing, torn, damaged, of another
format or stale is not used (:func:`load` says why, the recovery report shows
it as ``start_summary``); an agent whose log does not hold is read as without
a summary (``summary_passed_over``).
"""

from __future__ import annotations

import base64
import binascii
import itertools
import os
import stat
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from substrat import jsontext, persistence, summary_user
from substrat.agents import USER
from substrat.checkpoints import (
    CHECKPOINTS_DIR,
    Checkpoint,
    LogPoint,
    Stored,
    StoreRead,
    line_mismatch,
    read_store,
    store_path,
)
from substrat.eventlog import LOG_NAME, PENDING_NAME, any_suspect, decode_line, is_suspect
from substrat.facts import AgentFacts
from substrat.logs import USER_DIR
from substrat.session import Session, SessionState
from substrat.session.store import AGENTS_DIR, RECORD_NAME

SUMMARY_NAME = "start.json"
FORMAT = 3
"""2: no record or pending fingerprint, and no session id in a record's fields (the
summary is the authority of a clean stop: see the module docstring). 3: the user's row
may hold an entry (:mod:`substrat.summary_user`)."""
READ_FORMATS = (2, 3)
"""Formats a start reads: a format 2 summary has no user entry (the user's facts are
decoded at start, as without a summary)."""
MAX_FACTS_BYTES = 8 << 10
"""An agent whose checkpoint's facts are bigger is left to the store: decoding many
large facts in one piece would raise a start's peak memory."""

STALE = "is stale"
"""In :func:`load`'s reason for a summary older than its store (the store changed outside
substrat, or the root was copied or restored), not damaged. A crash leaves no summary: every
start retires it before its first write."""

SUMMARY_READ_BYTES = 16 << 20
"""What one read of the summary asks for: a summary of 10,000 agents (about 5 MB) is read
in one, with no copy (the pages of a buffer asked for but not filled are never touched)."""

CHUNK = 500
"""Endpoints per line of the file (each line is decoded on its own)."""

Fingerprint = list[int]

_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)

_STATES = {state.value: state for state in SessionState}
"""A record's state by its value: ``SessionState(value)`` per agent cost more."""


def fingerprint(st: os.stat_result) -> Fingerprint:
    """What a start compares of a file (see the module docstring)."""
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def summary_path(root: str | os.PathLike[str]) -> str:
    return os.path.join(os.fspath(root), CHECKPOINTS_DIR, SUMMARY_NAME)


_NO_ROW: Any = object()


@dataclass
class SummarizedStore(StoreRead):
    """The store as the summary says it is: its checkpoints are built when asked for."""

    rows: dict[str, list[Any]] = field(default_factory=dict)
    """Endpoint -> the row of its newest checkpoint (the summary holds no other: see
    :func:`build`), a list and no more per endpoint until it is asked for."""
    path: Path = field(default_factory=Path)

    def _built(self, endpoint: str) -> list[Checkpoint]:
        row = self.rows.pop(endpoint, _NO_ROW)
        if row is not _NO_ROW:
            self.checkpoints[endpoint] = [
                Checkpoint(endpoint, LogPoint(*row[:7]), None, Stored(self.path, row[7], row[8]))
            ]
        return self.checkpoints.get(endpoint, [])

    def latest(self, endpoint: str) -> list[Checkpoint]:
        return list(reversed(self._built(endpoint)))

    def newest(self, endpoint: str) -> Checkpoint | None:
        kept = self._built(endpoint)
        return kept[-1] if kept else None

    def kept_bytes(self) -> int:
        for endpoint in list(self.rows):
            self._built(endpoint)
        return super().kept_bytes()


@dataclass
class Summary:
    """A summary that held as a whole (checksum, format, the store's fingerprint)."""

    store: SummarizedStore
    agents: dict[str, list[Any]]
    """Session id -> [record fields (see :func:`session_of`), log fingerprint, facts]."""
    agents_dir: str = ""
    _fd: int | None = None
    """A descriptor of ``agents/`` opened once (:meth:`close` closes it): the path the
    ``stat`` a start makes per agent walks is two names, not the root's."""
    user: list[Any] | None = None
    """The user's entry, if the clean stop vouched for the user's facts
    (:mod:`substrat.summary_user`)."""

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def log_stat(self, session_id: str) -> os.stat_result:
        """The ``stat`` of the agent's log, through ``agents/``'s descriptor."""
        fd = self._fd
        if fd is None:
            fd = self._fd = os.open(self.agents_dir, _DIR_FLAGS)
        return os.stat(f"{session_id}{os.sep}{LOG_NAME}", dir_fd=fd)

    def log_holds(
        self, session_id: str, entry: list[Any], log_path: Callable[[str], str]
    ) -> tuple[os.stat_result, list[Any]]:
        """The ``stat`` of the agent's log and its newest checkpoint's row, if the log is
        as the entry says; ValueError (or OSError, TypeError, IndexError) otherwise. One
        ``stat`` of the log gives the fingerprint the entry holds: the log is as it was
        when the entry was derived from it and its newest checkpoint (it ended where
        that checkpoint does). Its record and pending file are not looked at: nothing
        has written them since (see the module docstring).

        ``log_path(session_id)``: the log's path, asked only while a failed append of
        this process waits to be taken back somewhere (:func:`is_suspect`)."""
        # the newest checkpoint's row, as store.newest(session_id) would build it (the
        # summary holds only each endpoint's newest): a Checkpoint per agent was a tenth
        # of a start, and most agents' is never asked for before they are used again
        row = self.store.rows.get(session_id)
        st = self.log_stat(session_id)
        if (
            type(row) is not list
            or len(row) < 9  # what a Checkpoint is built of (see SummarizedStore)
            or fingerprint(st) != entry[1]  # its size: where the checkpoint ends (see build)
            or row[1] != 1  # the checkpoint's file_first
            or (any_suspect() and is_suspect(log_path(session_id)))
        ):
            raise ValueError("its log is not as the entry says")
        return st, row

    def record(self, session_id: str, path: str) -> Session | None:
        """The record the agent's entry holds (``path``, the record's, is not read: see
        the module docstring) if one ``stat`` of its log gives the fingerprint the entry
        holds (a log changed by hand: the agent's files are all read); None otherwise
        (then the record is read). For the agents :mod:`substrat.recovery_quiet` does not
        take whole (a few: the parents of many)."""
        entry = self.agents.get(session_id)
        if entry is None:
            return None
        try:
            if fingerprint(self.log_stat(session_id)) != entry[1]:
                return None
            return session_of(session_id, entry[0])
        except (OSError, ValueError, TypeError, KeyError, binascii.Error):
            return None  # the read says what is wrong


def session_of(session_id: str, fields: list[Any]) -> Session:
    """The record an entry holds (its fields as :func:`_agent` wrote them)."""
    provider, model, state, blob, state_seq, agent_id, extra = fields
    return Session(
        session_id,
        provider,
        model,
        _STATES[state],
        base64.b64decode(blob) if blob else b"",
        state_seq,
        agent_id,
        dict(extra) if extra else {},
    )


def retire(root: str | os.PathLike[str]) -> None:
    """Remove the summary durably (``checkpoints/`` fsynced, whether it was there or
    not: an earlier removal whose fsync a crash cut short may not be durable yet).
    Call it before a process's first write to the root (see the module docstring).
    On a file system mounted read-only nothing can be written either: the summary
    stays (OSError otherwise, and the caller must not write)."""
    path = summary_path(root)
    try:
        persistence.durable_unlink(path)
    except OSError:
        if not persistence.on_read_only_fs(os.path.dirname(path)):
            raise


# -- writing ------------------------------------------------------------------------------


def build(root: str | os.PathLike[str]) -> bytes | None:
    """The summary of ``root`` as it is on disk now; None if the store cannot be summarised
    (missing, unreadable, damaged, or changing meanwhile)."""
    spath = store_path(root)
    try:
        before = os.stat(spath)
    except OSError:
        return None
    read = read_store(root)
    try:
        after = os.stat(spath)
    except OSError:
        return None
    if read.problem or read.damage or fingerprint(before) != fingerprint(after):
        return None
    if read.size != after.st_size:
        return None
    lines = [orjson.dumps({"format": FORMAT, "store": fingerprint(after)})]
    agents_dir = os.path.join(os.fspath(root), AGENTS_DIR)
    chunk: list[list[Any]] = []
    for endpoint, kept in read.checkpoints.items():
        # the newest only: a start that finds it does not hold sets every checkpoint aside
        # anyway (see substrat.recovery), so the fallback before it is never used then
        if endpoint != USER:
            entry = _agent(os.path.join(agents_dir, endpoint), endpoint, kept[-1])
        else:
            entry = _user(os.path.join(os.fspath(root), USER_DIR), kept[-1])
        chunk.append([endpoint, _row(kept[-1]), entry])
        if len(chunk) == CHUNK:
            lines.append(orjson.dumps(chunk))
            chunk = []
    if chunk:
        lines.append(orjson.dumps(chunk))
    body = b"\n".join(lines)
    return b"%d %d\n" % (zlib.crc32(body), len(body)) + body


_QUIET_KEPT = ("created", "highest_turn", "damaged_after", "completed_turns", "last_complete_seq")
_QUIET_EMPTY = (
    "pending",
    "kept",
    "settled_senders",
    "children",
    "waiting",
    "headless_turns",
    "open_turns",
    "lost_notice",
    "damage",
)


def facts_of(session_id: str, stored: Any) -> AgentFacts:
    """An entry's facts: a full map, or the row of a quiet agent (nothing pending, kept,
    waiting, open or damaged: every other field empty); ValueError if neither."""
    if type(stored) is dict:
        return AgentFacts.from_dict(session_id, stored)
    if not quiet_row(stored):
        raise ValueError("not the facts of a start summary entry")
    created, highest, damaged_after, completed, last_complete_seq = stored
    return AgentFacts.quiet(
        session_id, created, highest, damaged_after, completed, last_complete_seq
    )


def quiet_row(stored: Any) -> bool:
    """Whether an entry's facts are the row of a quiet agent (see :func:`facts_of`)."""
    return (  # no generator: a start asks this of every quiet agent
        type(stored) is list
        and len(stored) == len(_QUIET_KEPT)
        and type(stored[0]) is dict
        and type(stored[1]) is int
        and type(stored[2]) is int
        and type(stored[3]) is int
        and type(stored[4]) is int
    )


def _row(checkpoint: Checkpoint) -> list[Any]:
    at, stored = checkpoint.at, checkpoint.stored
    assert stored is not None  # read from the store
    return [
        at.seq,
        at.file_first,
        at.offset,
        at.length,
        at.crc,
        at.prefix_bytes,
        at.prefix_crc,
        stored.offset,
        stored.length,
    ]


def _ends_at(directory: str, at: LogPoint) -> os.stat_result | None:
    """The ``stat`` of the log in ``directory`` if it ends where the checkpoint at ``at``
    does, as a start checks it (never sealed, its line there, writable, no pending entry
    to replay); None otherwise (OSError, ValueError if a file does not read)."""
    if at.file_first != 1:
        return None
    _logged_pending(os.path.join(directory, PENDING_NAME), at.seq)
    fd = os.open(os.path.join(directory, LOG_NAME), os.O_RDWR | os.O_CLOEXEC)  # writable
    try:
        log_st = os.fstat(fd)
        line = os.pread(fd, at.length, at.offset)
    finally:
        os.close(fd)
    if log_st.st_size != at.offset + at.length or line_mismatch(at, line) is not None:
        return None
    return log_st


def _user(directory: str, checkpoint: Checkpoint) -> list[Any] | None:
    """The user's entry (:mod:`substrat.summary_user`), or None if a start must decode
    the user's facts itself."""
    try:
        log_st = _ends_at(directory, checkpoint.at)
    except (OSError, ValueError):
        return None
    if log_st is None:
        return None
    return summary_user.entry(checkpoint, fingerprint(log_st))


def _agent(directory: str, session_id: str, checkpoint: Checkpoint) -> list[Any] | None:
    """An agent's entry, or None if a start must read it as always (see the module
    docstring for what an entry asks of the agent's files)."""
    try:
        log_st = _ends_at(directory, checkpoint.at)
        if log_st is None:
            return None
        text = checkpoint.facts
        if len(text) > MAX_FACTS_BYTES:
            return None
        fd = os.open(os.path.join(directory, RECORD_NAME), os.O_RDONLY | os.O_CLOEXEC)
        try:
            record_st = os.fstat(fd)
            record = os.read(fd, record_st.st_size + 1)
        finally:
            os.close(fd)
        if len(record) != record_st.st_size:
            return None
        session = Session.from_record(record, expected_id=session_id)
        facts = jsontext.loads(text)
        if type(facts) is not dict or facts.get("created") is None or facts.get("terminated"):
            return None
        facts["session_created"] = None  # what a start drops (see substrat.recovery_logs)
        facts["last_complete"] = None
        AgentFacts.from_dict(session_id, facts)
        if all(not facts[key] for key in _QUIET_EMPTY):  # most agents: a short row
            facts = [facts[key] for key in _QUIET_KEPT]
        fields = [
            session.provider,
            session.model,
            session.state.value,
            base64.b64encode(session.provider_state).decode("ascii"),
            session.state_seq,
            session.agent_id,
            session.extra,
        ]
        return [fields, fingerprint(log_st), facts]
    except (OSError, ValueError):
        return None  # CorruptRecordError is a ValueError too


def _logged_pending(path: str, last_seq: int) -> None:
    """ValueError if the log's pending file holds an entry a start would replay or
    report (only none, one already in the log, as an open log leaves it, or an empty
    one, opens the way a start without it would).

    Read as :meth:`substrat.eventlog.EventLog` reads it at open: its first line."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return
    try:
        st = os.fstat(fd)
        raw = os.read(fd, st.st_size + 1)
    finally:
        os.close(fd)
    if not stat.S_ISREG(st.st_mode) or len(raw) != st.st_size:
        raise ValueError("not a pending file as a log leaves it")
    if raw:
        line, newline, _ = raw.partition(b"\n")
        entry = decode_line(line) if newline else "torn"
        if isinstance(entry, str) or entry["seq"] > last_seq:
            raise ValueError("a pending entry a start would replay or report")


def write(root: str | os.PathLike[str]) -> bool:
    """Write the summary of ``root`` (atomically), or remove a stale one if there is
    nothing to summarise; True if one was written. Call it with the root's lock held
    and nothing writing (a clean stop, after every log is closed)."""
    data = build(root)
    path = summary_path(root)
    if data is None:
        persistence.durable_unlink(path)
        return False
    persistence.atomic_write(path, data)
    return True


# -- reading ------------------------------------------------------------------------------


def load(root: str | os.PathLike[str]) -> tuple[Summary | None, str | None]:
    """The summary if it holds as a whole; else None and why (None, None if there is none)."""
    path = summary_path(root)
    try:
        raw = persistence.read_bytes(path, SUMMARY_READ_BYTES)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"{path} cannot be read: {exc}"
    # the body is read through a view, in place: a copy of the file for its body and
    # another for its lines were a quarter of a fresh daemon's page faults at a start
    newline = raw.find(b"\n")
    start = len(raw) if newline < 0 else newline + 1  # where the body begins
    try:
        head = raw[:newline] if newline >= 0 else raw
        crc, length = (int(part) for part in head.split(b" "))
    except ValueError:
        return None, f"{path} is damaged (no header)"
    view = memoryview(raw)
    body = view[start:]
    if length != len(body) or crc != zlib.crc32(body):
        return None, f"{path} is damaged or torn (its checksum does not match)"
    lines = _lines(raw, start)
    try:
        data = orjson.loads(view[lines[0] : lines[1] - 1])
    except orjson.JSONDecodeError:
        return None, f"{path} is damaged (not JSON)"
    if type(data) is not dict or data.get("format") not in READ_FORMATS:
        return None, f"{path} is of a format this version does not read"
    spath = store_path(root)
    try:
        store_fp = fingerprint(os.stat(spath))
    except OSError:
        store_fp = None
    if store_fp is None or data.get("store") != store_fp:
        return None, (
            f"{path} {STALE} (the checkpoint store is not the file it was written for: "
            "changed since, or copied or restored, which gives it a new inode)"
        )
    rows: dict[str, list[Any]] = {}
    agents: dict[str, list[Any]] = {}
    try:
        # a piece at a time: orjson builds a parse tree of all it decodes before the
        # objects, which for the whole file would raise a start's peak memory
        for begin, end in itertools.pairwise(lines[1:]):
            for endpoint, row, entry in orjson.loads(view[begin : end - 1]):
                rows[endpoint] = row
                if entry is not None:
                    agents[endpoint] = entry
    except (orjson.JSONDecodeError, TypeError, ValueError):
        return None, f"{path} is damaged (its fields)"
    size = store_fp[2]
    store = SummarizedStore(valid_end=size, size=size, rows=rows, path=spath)
    user = agents.pop(USER, None)  # format 2 has none: see substrat.summary_user
    return Summary(store, agents, os.path.join(os.fspath(root), AGENTS_DIR), user=user), None


def _lines(raw: bytes, start: int) -> list[int]:
    """Where each line of ``raw`` from ``start`` on begins, and one past its end (as if
    the last line ended with a newline): line i is ``raw[at[i] : at[i + 1] - 1]``."""
    at = [start]
    find = raw.find
    while (newline := find(b"\n", at[-1])) >= 0:
        at.append(newline + 1)
    at.append(len(raw) + 1)
    return at


__all__ = [
    "SUMMARY_NAME",
    "SummarizedStore",
    "Summary",
    "build",
    "facts_of",
    "load",
    "quiet_row",
    "retire",
    "session_of",
    "summary_path",
    "write",
]
