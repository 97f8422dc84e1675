"""An agent whose files cannot be read or written: what happened and what to do.

One agent's ``EACCES`` or ``EIO`` must cost that agent, never the daemon. Recovery
holds such an agent back (it is not served, and nothing of it is changed: no
quarantine, no termination, no repair), serves every other one, and reports it
here; so do ``daemon status`` and ``fsck``. Its descendants are held with it:
their place in the tree, and whether a cascade reached them, is in its log.
Fixing the cause and restarting brings all of them back as they were.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, replace
from typing import Any

from substrat.oserrors import advice, is_host_limit, os_error_of
from substrat.shellword import shell_word

_PERMISSION = (errno.EACCES, errno.EPERM)
_FILE_ENDINGS = (".json", ".jsonl", ".gz", ".start", ".base", ".pending", ".lock", ".tmp")
"""An agent's files (the advice names their directory); anything else is a directory."""


@dataclass(frozen=True)
class Unreadable:
    """One agent held back because its files could not be used."""

    session_id: str
    path: str
    error: str
    what_to_do: str
    held_by: str | None = None
    """For a descendant held with an unreadable ancestor: that ancestor's session id."""
    name: str | None = None
    """The agent's name when something readable knows it (the root registry does, for a root)."""

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def describe(exc: OSError) -> str:
    """``Permission denied (EACCES)``: the message and the errno's name."""
    name = errno.errorcode.get(exc.errno or 0, "")
    text = exc.strerror or str(exc)
    return f"{text} ({name})" if name else text


def unreadable(
    session_id: str, path: str | os.PathLike[str], exc: OSError, *, then: str
) -> Unreadable:
    """The report of an agent whose ``path`` failed with ``exc``; ``then`` is the next step
    (for example "restart the daemon")."""
    # a DurabilityError (an atomic write that failed) carries no errno: its cause does
    exc = os_error_of(exc) or exc
    where = os.fspath(exc.filename) if exc.filename else os.fspath(path)
    todo = what_to_do(exc, where, then=then)
    return Unreadable(session_id, where, describe(exc), todo + "; nothing of it was changed")


def failed(exc: OSError, *, then: str) -> str:
    """``PATH: Permission denied (EACCES); <what to do>, then <then>``: one line."""
    where = os.fspath(exc.filename) if exc.filename is not None else ""
    if not where:
        return f"{describe(exc)}; fix the cause, then {then}"
    return f"{where}: {describe(exc)}; {what_to_do(exc, where, then=then)}"


def what_to_do(exc: OSError, where: str, *, then: str) -> str:
    """What to do about ``exc`` met on ``where`` (a file or a directory), then ``then``."""
    directory = os.path.dirname(where) if where.endswith(_FILE_ENDINGS) else where
    if is_host_limit(exc):
        # nothing of the agent is damaged: the host refused a write (space, quota, a
        # limit, a read-only mount), and fixing the host brings the agent back whole
        todo = f"{advice(exc, agents=None)}, then {then}"
    elif exc.errno in _PERMISSION:
        uid = os.geteuid()
        todo = (
            f"give uid {uid} (the daemon's user) read and write access to {directory} and "
            f"its files (for example `chown -R {uid} {shell_word(directory)} && chmod -R "
            f"u+rwX {shell_word(directory)}`), then {then}"
        )
    elif exc.errno == errno.EIO:
        todo = (
            f"the disk failed to read or write {where}: check the device (dmesg, SMART), "
            f"copy {directory} somewhere safe, then {then}"
        )
    else:
        todo = f"fix {where} ({describe(exc)}), then {then}"
    return todo


def history_gone(
    session_id: str, path: str | os.PathLike[str], first: int, *, then: str
) -> Unreadable:
    """An agent whose log starts at ``first`` (its older segments removed by hand) and
    whose checkpoints are gone or do not hold."""
    where = os.fspath(path)
    return Unreadable(
        session_id,
        where,
        f"its log starts at entry {first} (the segments before it are missing) and no "
        "checkpoint of it holds",
        f"restore {os.path.join('checkpoints', 'events.jsonl')} (or the deleted segments) "
        f"from a backup, then {then}; nothing of it was changed",
    )


def named(items: dict[str, Unreadable], names: dict[str, str]) -> list[Unreadable]:
    """The held agents, sorted, each with the name ``names`` (session id -> name) knows."""
    return [replace(item, name=names.get(sid, item.name)) for sid, item in sorted(items.items())]


def held(
    session_id: str,
    path: str | os.PathLike[str],
    ancestor: str,
    *,
    then: str,
    name: str | None = None,
) -> Unreadable:
    """A descendant held back with its unreadable ancestor."""
    return Unreadable(
        session_id,
        os.fspath(path),
        f"its ancestor {ancestor} is unreadable",
        f"comes back with {ancestor}: fix that one, then {then}",
        held_by=ancestor,
        name=name,
    )
