"""The session store: session records under ``<root>/agents/<session-id>/``.

A record is rewritten atomically on creation and on every state change a restart
starts from: CREATED, SUSPENDED (with the provider's blob) and TERMINATED. ACTIVE
is never written (see :meth:`SessionStore.activate`). Loading
never lets one bad record stop the others: a record that cannot be read is
moved into ``<root>/quarantine/`` with a reason file, reported, and skipped.
The agent's event log stays where it is, so recovery can still rebuild the
agent from it.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from substrat import paths, persistence
from substrat.errors import CorruptRecordError, DurabilityError, SessionNotFoundError
from substrat.rootnest import NESTED_ROOT_ADVICE, root_within
from substrat.session.model import Session, SessionState, is_session_id, validate_session_id

AGENTS_DIR = "agents"
QUARANTINE_DIR = "quarantine"
TERMINATED_DIR = "terminated"
"""``terminated/<session-id>``: empty markers of the sessions whose record says
TERMINATED (each created after that record is durable, never removed), so a
restart need not read those records."""
RECORD_NAME = "session.json"
LOG_NAME = "events.jsonl"
MAX_RECORD_BYTES = 64 << 20
READ_CHUNK_BYTES = 64 << 10
KnownRecord = Callable[[str, str], "Session | None"]
"""``known(session_id, path)``: a record known without reading it, or None."""

Vouch = Callable[[str], bool]
"""``vouch(session_id)``: True if the caller takes the session whole, record and all,
from what it knows (a quiet agent of the start summary): the scan leaves it out."""


@dataclass(frozen=True)
class Quarantined:
    """A record (or directory) that scan could not load, and why."""

    name: str
    reason: str
    kind: str
    moved_to: str | None = None

    @property
    def is_session(self) -> bool:
        """A session's directory (its record is the trouble), not a name that is none."""
        return self.kind not in NOT_SESSIONS


NESTED_ROOT = "nested_root"
"""A name under ``agents/`` that is another substrat root (:func:`substrat.rootnest.root_within`):
reported and left where it is, never moved (its daemon may be running in it)."""
NOT_SESSIONS = frozenset({"bad_name", NESTED_ROOT})


@dataclass
class ScanResult:
    sessions: list[Session] = field(default_factory=list)
    quarantined: list[Quarantined] = field(default_factory=list)
    missing_records: list[str] = field(default_factory=list)
    """Session directories with no ``session.json`` (recovery may rebuild them)."""
    unreadable: dict[str, OSError] = field(default_factory=dict)
    """Sessions whose record could not be read or written (EACCES, EIO, ...): nothing
    is wrong with the record itself, so it is left where it is (see substrat.access)."""
    terminated: list[str] = field(default_factory=list)
    """Sessions whose record was not read because their marker says it is TERMINATED
    (only with ``scan(trust_markers=True)``)."""


class SessionStore:
    """Session records under one root (``$SUBSTRAT_HOME``)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = paths.under(root)
        self.agents_dir = paths.under(root, AGENTS_DIR)
        self.quarantine_dir = paths.under(root, QUARANTINE_DIR)
        self.terminated_dir = paths.under(root, TERMINATED_DIR)
        # Directories whose entries, and all above them, this store made durable.
        self._durable_dirs: set[Path] = set()
        self._durable_texts: set[str] = set()  # the same, as text (make_dir's fast path)
        # Sessions whose record this store wrote (see save): no stat before the next write.
        self._written: set[str] = set()
        self._agents_text = os.fspath(self.agents_dir)
        self._root_text = os.fspath(self.root)
        self._below_root = self._root_text.rstrip(os.sep) + os.sep

    def _path(self, session_id: str, name: str) -> Path:
        # each step and check asks for the same few (see substrat.paths); the id is
        # checked when its path is first built
        names = (session_id, name) if name else (session_id,)
        path = paths.built(self._agents_text, names)
        if path is None:
            path = paths.under(self._agents_text, validate_session_id(session_id), *names[1:])
        return path

    def session_dir(self, session_id: str) -> Path:
        return self._path(session_id, "")

    def log_path(self, session_id: str) -> Path:
        return self._path(session_id, LOG_NAME)

    def record_path(self, session_id: str) -> Path:
        return self._path(session_id, RECORD_NAME)

    def create_dir(self, session_id: str) -> Path:
        """Create the session's directory durably (and the root's, if missing)."""
        path = self.session_dir(session_id)
        self.make_dir(path)
        return path

    def make_root_durable(self) -> None:
        """Create the root if missing and make its entry, and every one above it, durable.

        Done once per store, at open (``Orchestrator.open``) or else by the first
        :meth:`make_dir`: the root may itself be left by an interrupted call.
        """
        if self.root not in self._durable_dirs:
            persistence.durable_mkdir(self.root)
            self._durable_dirs.add(self.root)
            self._durable_texts.add(self._root_text)

    def make_dir(self, path: Path) -> bool:
        """Create a directory under the root durably (see ``persistence.durable_mkdir``).

        The store remembers each directory it made durable that holds others
        (the root, ``agents/``) and fsyncs only below the deepest one: a new
        session directory costs one fsync, as a plain mkdir would. Nothing
        substrat does removes those directories while a store is open. Returns
        True if something was created.
        """
        text = paths.text(path)
        parent = os.path.dirname(text)
        assert text.startswith(self._below_root), path  # is_relative_to, not the root
        self.make_root_durable()
        # a new session's directory: its parent (agents/) is known, no Paths built
        if parent in self._durable_texts:
            return persistence.durable_mkdir(text, durable_base=parent)
        base = next(p for p in path.parents if p in self._durable_dirs)
        created = persistence.durable_mkdir(text, durable_base=base)
        self._durable_dirs.add(path.parent)
        self._durable_texts.add(parent)
        return created

    def save(self, session: Session) -> bool:
        """Write the record atomically; the directory is created durably if needed.

        A session's first record goes through :meth:`create_dir` even when the
        directory is visible: a call that failed or was killed before its fsync
        may have left it in the page cache only. Once a record is visible, the
        save that wrote it had made the directory durable first (records are
        written by this method alone), so later saves skip that step. True if this call
        created the directory: it then holds the record alone (a new session's log is
        opened without listing it, see ``LogPool.get``).
        """
        session_id = session.session_id
        record = self.record_path(session_id)
        created = False
        # A record this store wrote is visible unless the store moved it (quarantine
        # forgets it): its directory was made durable then, so no stat is needed.
        if session_id not in self._written and not os.path.exists(record):
            created = self.make_dir(self.session_dir(session_id))
        persistence.atomic_write(record, session.to_record())
        self._written.add(session_id)
        return created

    def save_new(self, session: Session) -> bool:
        """:meth:`save` the first record of a new session; if it is refused (a full disk),
        take its directory back: it holds nothing acknowledged, and left there fsck
        would take it for a creation a crash cut short. Only an empty directory goes
        (a crash may still leave one, as before)."""
        try:
            return self.save(session)
        except DurabilityError:
            with contextlib.suppress(OSError):
                os.rmdir(self.session_dir(session.session_id))
            raise

    def take_back_new(self, session_id: str, names: tuple[str, ...]) -> OSError | None:
        """Remove what a creation refused before its commit point left of a new session:
        its record, the files ``names`` (its log's; closed by the caller), their temp
        files and the directory. Nothing in it was acknowledged, and left there the next
        start's recovery would terminate it as an orphan. By name, not by listing: a
        refusal for want of descriptors leaves none to list with. Not made durable (a
        crash may bring it back: recovery handles that, as before). The error if some of
        it stays (recovery then handles it)."""
        self._written.discard(session_id)
        for name in (RECORD_NAME, *names):
            temp = name + persistence.TMP_SUFFIX
            for path in (self._path(session_id, name), self._path(session_id, temp)):
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    return exc
        try:
            os.rmdir(self.session_dir(session_id))
        except FileNotFoundError:
            pass
        except OSError as exc:
            return exc
        return None

    def activate(self, session: Session) -> None:
        """Make ``session`` ACTIVE (its provider session is live) in memory only.

        Nothing reads an ACTIVE record but a restart, which takes it for SUSPENDED (no
        provider session survives a crash) and rewrites it so, with the same blob and
        ``state_seq``. So ACTIVE on disk would say nothing the record before it does
        not: a crash while the session is live leaves the record it had, SUSPENDED
        (what recovery made of the ACTIVE one, byte for byte) or CREATED (no blob:
        the session is rebuilt from the log, or made new if the log has no completed
        turn, the same session a restore with nothing builds). Not writing it saves a
        durable write at each root's creation and each restore, and the restart's
        rewrite of every session a crash found live. Records an older substrat left
        ACTIVE are still made SUSPENDED by :meth:`recover`. docs/orchestrator.md,
        "Session records", has each crash point with and without the write.
        """
        session.transition(SessionState.ACTIVE)

    def transition(self, session: Session, target: SessionState) -> None:
        """Change state and persist; the in-memory state changes only if the write did.

        Any state is written as it is given (ACTIVE too: the store's contract tests
        write one, as an older substrat did); substrat's own code makes a session
        ACTIVE through :meth:`activate` only, which writes nothing."""
        previous = session.state
        session.transition(target)
        try:
            self.save(session)
        except Exception:
            session.state = previous
            raise
        if target is SessionState.TERMINATED:
            self._mark_terminated(session.session_id)

    def _mark_terminated(self, session_id: str) -> None:
        """Leave the session's terminated marker (see ``TERMINATED_DIR``).

        Only after the fsyncs of its TERMINATED record and the record's directory,
        so no crash leaves the marker without that record. Made durable like any
        created file, but a failure is not the termination's: the marker is a
        hint, and without it a restart reads the record as before.
        """
        try:
            if self.terminated_dir not in self._durable_dirs:  # once per store
                self.make_dir(self.terminated_dir)
                self._durable_dirs.add(self.terminated_dir)
            persistence.durable_create(self.terminated_dir / session_id)
        except OSError:  # DurabilityError included: the marker may or may not be there
            pass

    def marked_terminated(self) -> set[str]:
        """The sessions with a terminated marker (none if ``terminated/`` does not list)."""
        try:
            return {name for name in os.listdir(self.terminated_dir) if is_session_id(name)}
        except OSError:  # missing (a root of an older substrat), or unreadable
            return set()

    def load(self, session_id: str) -> Session:
        path = self.record_path(session_id)
        try:
            raw = persistence.read_bytes(path)
        except FileNotFoundError:
            raise SessionNotFoundError(f"no session record at {path}") from None
        return Session.from_record(raw, expected_id=session_id)

    def exists(self, session_id: str) -> bool:
        return os.path.exists(self.record_path(session_id))

    def list_dirs(self) -> tuple[list[str], list[str]]:
        """(valid session ids, other names) under ``agents/``, sorted."""
        good: list[str] = []
        bad: list[str] = []
        try:
            # scandir: whether an entry is a directory comes with the listing (no stat
            # per agent, as os.path.isdir would cost; a symlink is still followed)
            with os.scandir(self.agents_dir) as entries:
                for entry in entries:
                    name = entry.name
                    if not is_session_id(name):
                        bad.append(name)
                    # a plain file with a session's name is not a session (and has no
                    # record to move)
                    elif entry.is_dir():
                        good.append(name)
                    else:
                        bad.append(name)
        except FileNotFoundError:
            return [], []
        good.sort()
        bad.sort()
        return good, bad

    def scan(
        self,
        *,
        quarantine: bool = True,
        known: KnownRecord | None = None,
        trust_markers: bool = False,
        vouch: Vouch | None = None,
    ) -> ScanResult:
        """Load every record. Never fails on one bad record.

        With ``quarantine=False`` nothing on disk changes (for read-only checks).
        ``known(session_id, path)`` may give a record without reading it (the start
        summary, :mod:`substrat.start_summary`); None reads it. A session that
        ``vouch(session_id)`` takes (see :data:`Vouch`) is in no list of the result.
        With ``trust_markers``, a session with a terminated marker is listed in
        ``terminated`` and its record is not read (for a restart: all it needs of
        a terminated session's record is that it says TERMINATED, and about half
        of a long-lived root's records do). fsck and the other readers read all.
        """
        result = ScanResult()
        good, bad = self.list_dirs()
        marked = self.marked_terminated() if trust_markers else set()
        for name in bad:
            result.quarantined.append(self._bad_name(name))
        agents_dir = os.fspath(self.agents_dir)
        for session_id in good:
            if session_id in marked:
                result.terminated.append(session_id)
                continue
            # a string path: a Path per agent was a tenth of a 10,000-agent start
            if vouch is not None and vouch(session_id):
                continue
            path = f"{agents_dir}{os.sep}{session_id}{os.sep}{RECORD_NAME}"
            if known is not None:
                session = known(session_id, path)
                if session is not None:
                    result.sessions.append(session)
                    continue
            try:
                raw = _read_limited(path)
            except FileNotFoundError:
                result.missing_records.append(session_id)
                continue
            except CorruptRecordError as exc:
                result.quarantined.append(
                    self._quarantine(session_id, f"unreadable: {exc}", "unreadable", quarantine)
                )
                continue
            except OSError as exc:  # the disk or the permissions, not the record: keep it
                result.unreadable[session_id] = exc
                continue
            try:
                result.sessions.append(Session.from_record(raw, expected_id=session_id))
            except CorruptRecordError as exc:
                result.quarantined.append(
                    self._quarantine(session_id, str(exc), "corrupt", quarantine)
                )
        return result

    def recover(self, known: KnownRecord | None = None, vouch: Vouch | None = None) -> ScanResult:
        """Scan, flip every ACTIVE session to SUSPENDED on disk, and return the scan.

        After a crash no provider session is live, so a record that says ACTIVE
        is stale. This substrat writes none (see :meth:`activate`): only a root an
        older version wrote, or a record written by hand, has one. Running this
        twice gives the same result.
        """
        result = self.scan(known=known, trust_markers=True, vouch=vouch)
        for session in list(result.sessions):
            if session.state is SessionState.ACTIVE:
                try:
                    self.transition(session, SessionState.SUSPENDED)
                except OSError as exc:  # e.g. a read-only directory: this session only
                    result.sessions.remove(session)
                    result.unreadable[session.session_id] = exc
        return result

    def _bad_name(self, name: str) -> Quarantined:
        why = root_within(self.agents_dir / name)
        if why is None:
            return Quarantined(name, "directory name is not a session id; ignored", "bad_name")
        reason = f"a substrat root inside this one: {why}; {NESTED_ROOT_ADVICE}"
        return Quarantined(name, reason, NESTED_ROOT)

    def _quarantine(self, session_id: str, reason: str, kind: str, move: bool) -> Quarantined:
        if not move:
            return Quarantined(session_id, reason, kind)
        self.make_dir(self.quarantine_dir)
        stem = f"{session_id}.{RECORD_NAME}"
        index = 0
        while os.path.exists(self.quarantine_dir / f"{stem}.{index}"):
            index += 1
        target = self.quarantine_dir / f"{stem}.{index}"
        reason_blob = json.dumps({"session_id": session_id, "kind": kind, "reason": reason})
        persistence.atomic_write(
            self.quarantine_dir / f"{stem}.{index}.reason.json", reason_blob.encode()
        )
        self._written.discard(session_id)
        persistence.durable_rename(self.record_path(session_id), target)
        return Quarantined(session_id, reason, kind, str(target))


def _read_limited(path: str | os.PathLike[str]) -> bytes:
    """A record's bytes (CorruptRecordError past ``MAX_RECORD_BYTES``).

    Read through ``os.open``/``os.read`` in ``READ_CHUNK_BYTES`` pieces: a file object
    per record was a third of reading it, and a record is read at every start.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks: list[bytes] = []
        size = 0
        while chunk := os.read(fd, READ_CHUNK_BYTES):
            size += len(chunk)
            if size > MAX_RECORD_BYTES:
                raise CorruptRecordError(f"record is over {MAX_RECORD_BYTES} bytes")
            chunks.append(chunk)
    except IsADirectoryError:  # no record there, only something in its place
        raise CorruptRecordError(f"{path} is not a file (a directory is in its place)") from None
    finally:
        os.close(fd)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
