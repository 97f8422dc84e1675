"""What an operator can do about an I/O error: one line of advice per errno.

The daemon meets the host's limits while it serves (a full disk, a read-only
remount, a descriptor or file-size limit, permissions changed under it). Each
becomes an error answer and a line in daemon.log; this module words the remedy,
so every front end says the same thing. Pure: no I/O, so the CLI can load it.
"""

from __future__ import annotations

import errno

from substrat.words import plural

FDS_PER_AGENT = 2
"""Descriptors the daemon keeps open per live agent: its event log and that log's
pending copy (docs/daemon.md, "Host limits"; measured: 11 with one client and no
agent, 73 with 30 agents)."""
FDS_BASE = 16 + 64
"""Descriptors a daemon holds whatever its agents: about 16 of its own (the socket,
daemon.log, the lock, the root registry, the user's log) plus one per client
connection, up to the default 64 (``--max-connections``)."""


def os_error_of(exc: BaseException | None) -> OSError | None:
    """The first OSError with an errno in ``exc`` and its causes (a DurabilityError
    wraps the OSError that failed)."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, OSError) and exc.errno is not None:
            return exc
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


def fd_budget(agents: int) -> int:
    """About how many descriptors a daemon serving ``agents`` live agents needs."""
    return FDS_BASE + FDS_PER_AGENT * max(0, agents)


def advice(exc: BaseException | None, *, agents: int | None = None) -> str | None:
    """One line saying what fixes ``exc``, or None for an error no host setting explains."""
    err = os_error_of(exc)
    if err is None:
        return None
    code = err.errno
    if code in (errno.ENOSPC, errno.EDQUOT):
        what = "the disk is full" if code == errno.ENOSPC else "the disk quota is exceeded"
        return f"{what}: free space on the root's file system"
    if code == errno.EFBIG:
        return "a file reached the file size limit: raise `ulimit -f` for the daemon"
    if code == errno.EROFS:
        return "the root is on a read-only file system: remount it read-write"
    if code in (errno.EACCES, errno.EPERM):
        where = f" on {err.filename}" if err.filename else ""
        return f"permission denied{where}: give the daemon's user read and write access"
    if code in (errno.EMFILE, errno.ENFILE):
        which = "the system's" if code == errno.ENFILE else "the daemon's"
        need = ""
        if agents is not None:
            need = f" ({plural(agents, 'agent')}: about {fd_budget(agents)})"
        return (
            f"{which} open-file limit is reached: raise `ulimit -n` where the daemon starts; "
            f"it keeps about {FDS_PER_AGENT} files open per live agent and 1 per "
            f"connection{need}"
        )
    if code == errno.EIO:
        return "the disk failed a read or write: check the device (dmesg, SMART)"
    return None


def with_advice(text: str, exc: BaseException, *, first: bool = False) -> str:
    """``text`` (about ``exc``), followed by what fixes ``exc`` when :func:`advice` knows
    (``first``: preceded by it, for a text that ends in its own, lesser, instruction)."""
    hint = advice(exc)
    if not hint or hint in text:  # a message built on one that already says it
        return text
    return f"{hint}; {text}" if first else f"{text}; {hint}"


def is_host_limit(exc: BaseException | None) -> bool:
    """Whether ``exc`` comes from the host (space, quota, limits, a read-only mount,
    permissions) rather than from damaged data: fixing the host fixes it."""
    err = os_error_of(exc)
    return err is not None and err.errno in _HOST_LIMITS


_HOST_LIMITS = frozenset(
    {
        errno.ENOSPC,
        errno.EDQUOT,
        errno.EFBIG,
        errno.EROFS,
        errno.EMFILE,
        errno.ENFILE,
    }
)
