"""What the checks read of a recovered root: each log once per check, memoised between checks.

:class:`Reads` serves one check (the disk does not change while it runs);
:class:`Memos` keeps what was derived from each log from one check to the next,
keyed by the log's bytes (see :mod:`oracle.incremental`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from oracle.errors import OracleViolation
from oracle.incremental import files_below, log_files, log_part
from oracle.log_start import start_record_problems
from substrat import events
from substrat.eventlog import LOG_NAME, DamageReport, Entry, LogRead, decode_line, read_log
from substrat.events import KNOWN_EVENTS
from substrat.logbase import BaseUnreadable, LogBase, read_base
from substrat.registry import RegistryRead, read_registry, registry_path
from substrat.session.store import RECORD_NAME

if TYPE_CHECKING:
    from faultfs import FaultFS
    from oracle.incremental import FilesMemo
    from substrat.orchestrator import Orchestrator
    from substrat.providers.base import TurnRecord
    from substrat.session.store import ScanResult

TurnView = tuple[str, str, str]
"""One turn as compared: (prompt, response, transcript as canonical JSON)."""

LogFacts = tuple[bool, set[str]]
"""Whether a log's seqs strictly increase, and its pending messages (enqueued minus
delivered)."""


@dataclass
class Memos:
    """What the checks derive from each log, kept from one check to the next.

    Keyed by the bytes of the log's files, the active one and its sealed segments
    (:class:`oracle.incremental.FilesMemo`, :func:`oracle.incremental.log_files`), so a log
    a step did not touch is neither read nor parsed again, whichever crash
    image it is on.
    """

    reads: FilesMemo[LogRead]
    turns: FilesMemo[list[TurnView]]
    registry: FilesMemo[RegistryRead]
    records: FilesMemo[ScanResult]
    """The session store's read-only scan, keyed by the records (not the logs beside them)."""
    bases: FilesMemo[LogBase | str | None]
    """A log's base as ``read_base`` finds it (or why it does not read), keyed by the log."""
    starts: FilesMemo[list[str]]
    """What :func:`start_record_problems` says of a log, keyed by the log."""
    facts: dict[str, tuple[LogRead, LogBase | None, LogFacts]] = field(default_factory=dict)
    """Endpoint -> a log's read and base, and what the invariants derived from them
    (see :func:`log_facts`)."""

    @classmethod
    def new(cls) -> Memos:
        from oracle.incremental import FilesMemo

        return cls(FilesMemo(), FilesMemo(), FilesMemo(), FilesMemo(), FilesMemo(), FilesMemo())


class Reads:
    """The logs of a recovered root, each read once per check.

    The checks look at every log several times (conversations, the in-flight
    turn's effects, the invariants); the disk does not change while they run.
    With ``memos`` (and the ``fs`` the root is on; None for the real disk), a
    log is parsed again only when its bytes changed since an earlier check.
    """

    def __init__(
        self, orch: Orchestrator, memos: Memos | None = None, fs: FaultFS | None = None
    ) -> None:
        self.orch = orch
        self.memos = memos
        self.fs = fs
        self._reads: dict[str, LogRead] = {}
        self._files: dict[str, dict[str, Any]] = {}
        self._log_files: dict[str, dict[str, Any]] = {}
        self._bases: dict[str, LogBase | None] = {}
        self._agents = os.fspath(orch.store.agents_dir)
        self._split: bool | None = None

    def files(self, path: str | os.PathLike[str]) -> dict[str, Any]:
        """The bytes at ``path`` (``files_below``), read once per check for all memos.

        A session's directory is cut out of one read of the agents directory (the
        session store's scan reads it whole anyway) instead of read on its own.
        """
        key = os.fspath(path)
        found = self._files.get(key)
        if found is None:
            parent, _, _ = key.rpartition(os.sep)
            if parent == self._agents and self._split_agents():
                found = self._files.get(key, {})  # not below it: missing, as files_below says
            else:
                found = files_below(self.fs, key)
            self._files[key] = found
        return found

    def _split_agents(self) -> bool:
        """Fill ``_files`` with each directory below the agents directory, as
        ``files_below`` gives it, from one read of the whole; False if that does not
        read as a directory (then each is read on its own)."""
        if self._split is None:
            tree = self.files(self._agents)
            self._split = "" not in tree
            if self._split:
                below: dict[str, dict[str, Any]] = {}
                for name, data in tree.items():
                    top, slash, rest = name.partition("/")
                    if slash:
                        below.setdefault(top, {})[rest] = data
                    elif data is None:
                        below.setdefault(top, {})
                    else:  # a file where a session's directory would be
                        below[top] = {"": data}
                for top, files in below.items():
                    self._files.setdefault(f"{self._agents}{os.sep}{top}", files)
        return self._split

    def log_files(self, directory: str) -> dict[str, Any]:
        """What reading the log in ``directory`` reads of its files (``log_part``)."""
        found = self._log_files.get(directory)
        if found is None:
            found = self._log_files[directory] = log_part(self.files(directory))
        return found

    def log(self, endpoint_session: str) -> LogRead:
        read = self._reads.get(endpoint_session)
        if read is None:
            path = self.orch.logs.path(endpoint_session)
            if self.memos is None:
                read = read_log(path)
            else:
                directory = log_files(path)
                read = self.memos.reads.get(
                    self.fs,
                    directory,
                    lambda: read_log(path),
                    self.log_files(directory),
                    extended_read,
                )
            self._reads[endpoint_session] = read
        return read

    def scan(self) -> ScanResult:
        """The session store's records as ``store.scan(quarantine=False)`` finds them."""
        store = self.orch.store
        if self.memos is None:
            return store.scan(quarantine=False)
        # What the scan reads: the names below agents/ (and which are directories)
        # and each session's record; not the logs that share the directories.
        records = {
            name: data
            for name, data in self.files(store.agents_dir).items()
            if "/" not in name or name.endswith("/" + RECORD_NAME)
        }
        return self.memos.records.get(
            self.fs, store.agents_dir, lambda: store.scan(quarantine=False), records
        )

    def registry(self) -> RegistryRead:
        """The root registry as ``read_registry`` finds it."""
        if self.memos is None:
            return read_registry(self.orch.root)
        return self.memos.registry.get(
            self.fs, registry_path(self.orch.root), lambda: read_registry(self.orch.root)
        )

    def base(self, endpoint_session: str) -> LogBase | None:
        """The log's base (what the ``delete`` policy removed held); None without one.

        Raises OracleViolation if it is there and does not read: a crash never damages
        a file written atomically.
        """
        if endpoint_session not in self._bases:
            path = self.orch.logs.path(endpoint_session)
            if self.memos is None:
                found = _base_or_why(path)
            else:  # the base is a file of the log's directory: keyed with the log
                directory = log_files(path)
                found = self.memos.bases.get(
                    self.fs, directory, lambda: _base_or_why(path), self.log_files(directory)
                )
            if isinstance(found, str):
                raise OracleViolation(f"a log's base does not read after a crash: {found}")
            self._bases[endpoint_session] = found
        return self._bases[endpoint_session]

    def start_problems(self, who: str, endpoint_session: str) -> list[str]:
        """:func:`start_record_problems` of the log (its start record against its entries)."""
        path = self.orch.logs.path(endpoint_session)
        read = self.log(endpoint_session)
        if self.memos is None:
            return start_record_problems(who, read, path)
        # The start record is a file of the log's directory, and the entries are derived
        # from that directory's files: keyed by them (and by who, which the text names).
        directory = log_files(path)
        return self.memos.starts.get(
            self.fs,
            f"{directory}#{who}",
            lambda: start_record_problems(who, read, path),
            self.log_files(directory),
        )

    def history(self, agent_id: str) -> list[TurnRecord]:
        """What ``orch.history(agent_id)`` returns, from the cached read (the log's base
        first, if the ``delete`` policy removed its first segments)."""
        from substrat.conversation import conversation_with_base

        node = self.orch.tree.resolve(agent_id)
        return conversation_with_base(self.base(node.session_id), self.log(node.session_id).entries)


def extended_read(
    then: LogRead, files_then: dict[str, Any], files_now: dict[str, Any]
) -> LogRead | None:
    """``read_log`` of a log's files now (``log_part`` of its directory), from its read
    ``then``, when all that changed is whole, healthy lines appended to the active
    file, each of a known event and numbered on from the highest ``seq`` before; None
    otherwise (the caller reads the log whole).

    After a crash most logs the check reads again only grew (a turn, a message), and
    the read of then was clean (no damage, no unknown event, ending at the file's end):
    ``read_log`` would give its entries, then those of the new lines, and no damage
    (no duplicate, no gap: each new ``seq`` is one above the last), ending at the new
    end. Anything else (a line cut or damaged, a file cut, rewritten or added, a seq
    that skips or repeats) is read in full, as every read was before.
    """
    before, after = files_then.get(LOG_NAME), files_now.get(LOG_NAME)
    if (
        type(before) is not bytes
        or type(after) is not bytes
        or len(after) <= len(before)
        or not then.entries
        or then.damage.items
        or then.damage.unknown_events
        or then.valid_end != len(before)
        or not after.startswith(before)
        or files_then.keys() != files_now.keys()
        or any(files_now[name] != data for name, data in files_then.items() if name != LOG_NAME)
    ):
        return None
    last = then.entries[-1]["seq"]
    if any(entry["seq"] >= last for entry in then.entries[:-1]):
        return None  # the last entry is not the highest: a new seq might repeat one
    added: list[Entry] = []
    for raw in after[len(before) :].splitlines(keepends=True):
        entry = decode_line(raw[:-1]) if raw.endswith(b"\n") else "torn"
        if isinstance(entry, str) or entry["seq"] != last + 1:
            return None
        if entry.get("event") not in KNOWN_EVENTS:
            return None
        last += 1
        added.append(entry)
    return LogRead([*then.entries, *added], DamageReport(), len(after))


def _base_or_why(path: str | os.PathLike[str]) -> LogBase | str | None:
    """The log's base (None without one), or why it does not read."""
    try:
        return read_base(path)
    except BaseUnreadable as exc:
        return str(exc)


def log_facts(reads: Reads, log_name: str, read: LogRead, base: LogBase | None) -> LogFacts:
    """:func:`derive_log_facts`, kept while the log reads as the very same objects.

    With memos, ``reads.log`` and ``reads.base`` hand back the objects an earlier
    check derived when the log's files are unchanged; the facts are a function of
    those objects alone (nothing mutates a read's entries), so they are kept with
    them and derived again when either is a new object. Without memos every check
    derives them.
    """
    memos = reads.memos
    if memos is None:
        return derive_log_facts(read, base)
    held = memos.facts.get(log_name)
    if held is not None and held[0] is read and held[1] is base:
        return held[2]
    facts = derive_log_facts(read, base)
    memos.facts[log_name] = (read, base, facts)
    return facts


def derive_log_facts(read: LogRead, base: LogBase | None) -> LogFacts:
    """:data:`LogFacts` of ``read``, a log as ``read_log`` found it, and ``base``, its
    base (None without one)."""
    seqs = [e["seq"] for e in read.entries]
    in_order = seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    enqueued: dict[str, None] = {}
    delivered: set[str] = set()
    floor = 0
    if base is not None and seqs and seqs[0] > 1:
        # entries up to the base's checkpoint are summed up in it: its pending
        # messages, then what the log says after it
        floor = base.checkpoint.at.seq
        enqueued.update(dict.fromkeys(base.checkpoint.load_facts().enqueued))
    for entry in read.entries:
        if entry["seq"] <= floor:
            continue
        data = entry.get("data") or {}
        if entry["event"] == events.MESSAGE_ENQUEUED:
            enqueued[data["message_id"]] = None
        elif entry["event"] == events.MESSAGE_DELIVERED:
            delivered.update(data.get("message_ids") or [data.get("message_id")])
        elif entry["event"] == events.TURN_COMPLETE:
            delivered.update((data.get("effects") or {}).get("delivered", []))
    return in_order, {m for m in enqueued if m not in delivered}
