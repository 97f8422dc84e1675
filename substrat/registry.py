"""The root registry: which root agents must exist, kept outside their own directories.

A root agent lives only in ``agents/<session-id>/``; a child is also named by
its parent's committed ``turn.complete``. So a deleted root directory would
leave nothing behind that knew the root existed. The registry,
``<root>/roots/events.jsonl``, is an event log (the same format, writer and
durability as an agent's log: fsync before returning, a failed append taken
back, torn tails cut on open, damaged lines skipped and reported) with
one ``root.registered`` entry per root agent.

The tree is still rebuilt from the agents' logs; the registry only says which
roots must exist, and so which missing directories are lost data.

Crash rule (create, then register): ``create_root`` writes the record,
``session.created`` and ``agent.created`` (the commit point), then the
registration, and only then answers. So a registration exists only for a root
whose ``agent.created`` was durable: a registered root with no directory is
always lost data, never a creation cut short. A crash between the commit point
and the registration leaves a committed root that is not registered yet;
recovery registers every live root its logs show and the registry lacks (the
same rule rebuilds the registry after damage). A root whose creation never
reached ``agent.created`` is never registered, and recovery terminates it as an
orphan, as before.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from substrat import access, events, paths, persistence
from substrat.agents import AgentNode
from substrat.errors import RootRegistryError
from substrat.eventlog import (
    LOG_NAME,
    Clock,
    Entry,
    EventLog,
    Resume,
    read_log,
    repair_log,
    utc_now_iso,
)
from substrat.facts import AgentFacts
from substrat.segments import active_start, list_log
from substrat.session import SessionStore

REGISTRY_DIR = "roots"
FIELDS = ("session_id", "agent_id", "name", "provider", "model")
_HOST_ERRNOS = (errno.EACCES, errno.EPERM, errno.EIO, errno.EROFS)
_QUARANTINED_SESSION = re.compile(r"([0-9a-f]{32})\.session\.[0-9]+")


def root_entry(node: AgentNode) -> dict[str, Any]:
    """The ``root.registered`` data of a root agent."""
    return {
        "session_id": node.session_id,
        "agent_id": node.agent_id,
        "name": node.name,
        "provider": node.provider,
        "model": node.model,
    }


def creation_from_registry(facts: AgentFacts, data: dict[str, Any]) -> None:
    """Stand in for a registered root's unreadable ``agent.created`` (and ``session.created``)."""
    facts.created = {
        "agent_id": data.get("agent_id"),
        "name": data.get("name"),
        "parent_session_id": None,
        "instructions": str((facts.session_created or {}).get("system_prompt", "")),
    }
    if facts.session_created is None:
        facts.session_created = {"provider": data.get("provider"), "model": data.get("model")}


def lost_root(data: dict[str, Any], *, what: str = "") -> dict[str, Any]:
    """The report of a registered root whose directory (or ``what`` in it) is gone."""
    sid = str(data.get("session_id"))
    where = f"agents/{sid}" + (f"/{what}" if what else "")
    return {
        "session_id": sid,
        "agent_id": data.get("agent_id"),
        "name": data.get("name"),
        "path": where,
        "what_to_do": (
            f"{where} (root agent {data.get('name')!r}) is gone: its turns, messages and "
            f"children are lost; restore it from a backup, then restart the daemon"
        ),
    }


def quarantined_sessions(store: SessionStore) -> set[str]:
    """Session ids an earlier ``fsck --repair`` moved into ``quarantine/`` whole.

    Such a root is not lost: it is held there, and fsck said so when it moved it.
    """
    try:
        names = os.listdir(store.quarantine_dir)
    except FileNotFoundError:
        return set()
    return {m.group(1) for n in names if (m := _QUARANTINED_SESSION.fullmatch(n))}


def registry_path(root: str | os.PathLike[str]) -> Path:
    return paths.under(root, REGISTRY_DIR, LOG_NAME)


@dataclass
class RegistryRead:
    """What the registry holds: session id -> its ``root.registered`` data."""

    roots: dict[str, dict[str, Any]] = field(default_factory=dict)
    damage: dict[str, int] = field(default_factory=dict)
    problem: str | None = None
    """Why the registry could not be read at all (then ``roots`` is empty)."""

    def add_all(self, entries: list[Entry]) -> None:
        for entry in entries:
            data = entry.get("data")
            if entry.get("event") == events.ROOT_REGISTERED and type(data) is dict:
                sid = data.get("session_id")
                if isinstance(sid, str):
                    self.roots[sid] = data


def read_registry(root: str | os.PathLike[str]) -> RegistryRead:
    """Read the registry without changing anything (for fsck and the dry run)."""
    read = RegistryRead()
    path = registry_path(root)
    try:
        log = read_log(path)
    except OSError as exc:
        read.problem = f"{path}: {exc}"
        return read
    read.add_all(log.entries)
    read.damage = log.damage.counts()
    return read


def _mode(path: Path) -> int | None:
    """``path``'s own mode (not a symlink's target); None if it is not there.

    Any other failure (EACCES on a ``roots/`` at mode 000, EIO) raises: taking it
    for "not there" would let recovery try to create the log, and die of it.
    """
    try:
        return os.lstat(path).st_mode
    except FileNotFoundError:
        return None


class RootRegistry:
    """The registry of one root, opened lazily, appended to by ``create_root``."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        clock: Clock = utc_now_iso,
        make_dir: Callable[[Path], object] = persistence.durable_mkdir,
    ) -> None:
        self.path = registry_path(root)
        self._clock = clock
        # The orchestrator's SessionStore.make_dir: the root and every level above it are
        # durable since the open, so only the root is fsynced for roots/, not each level
        # up to the file system's root again (durable_mkdir's default walk).
        self._make_dir = make_dir
        self._log: EventLog | None = None
        self.read = RegistryRead()
        self._advice: str | None = None
        # Where load's repair left the file: register's first open starts there (the
        # root is held, so nothing else wrote it) instead of scanning it again.
        self._resume: Resume | None = None

    def load(self) -> RegistryRead:
        """Repair and read the registry (recovery does this once, first); leave it closed.

        A registry that cannot be read is reported in ``problem``, never raised:
        the daemon still serves every agent (only creating roots waits for a fix).
        """
        self.close()
        self._advice = self._resume = None
        read = RegistryRead()
        try:
            # one lstat each (a symlink is followed, as os.path.isdir and isfile would)
            mode = _mode(self.path.parent)
            if mode is not None and not stat.S_ISDIR(mode) and not os.path.isdir(self.path.parent):
                raise NotADirectoryError(f"{self.path.parent} is not a directory")
            mode = _mode(self.path)
            if mode is not None and not stat.S_ISREG(mode) and not os.path.isfile(self.path):
                raise IsADirectoryError(f"{self.path} is not a regular file")
            if mode is not None:  # a regular file, or a symlink to one
                sealed, names = list_log(self.path)
                listed = (sealed, active_start(self.path, sealed, names), names)
                opened = repair_log(self.path, read.add_all, listed=listed)
                read.damage = opened.kept_damage().counts()
                self._resume = opened.resume()
        except OSError as exc:
            read = RegistryRead(problem=f"{self.path}: {exc}")
            if exc.errno in _HOST_ERRNOS:  # modes, a device: fsck --repair cannot fix those
                self._advice = access.what_to_do(exc, str(self.path), then="restart the daemon")
        self.read = read
        return read

    def check_usable(self) -> None:
        """Raise RootRegistryError (saying what to do) if no root can be registered."""
        if self.read.problem is not None:
            todo = self._advice or ("stop the daemon, run `substrat fsck --repair`, start it again")
            raise RootRegistryError(
                f"the root registry is unusable ({self.read.problem}), so no root agent can "
                f"be created; {todo}"
            )

    def register(self, data: dict[str, Any]) -> None:
        """Register a root durably (returns after the fsync)."""
        assert set(data) == set(FIELDS), data
        self.check_usable()
        if self._log is None or self._log.closed:
            self._make_dir(self.path.parent)
            resume, self._resume = self._resume, None
            context = {"endpoint": REGISTRY_DIR}
            self._log = EventLog(self.path, context, clock=self._clock, resume=resume)
        self._log.log(events.ROOT_REGISTERED, data)
        self.read.roots[data["session_id"]] = dict(data)

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
