"""Faults other than crashes, injected into a running workload: failing fsyncs.

``failing_fsync(fs, nth, count)`` makes fsyncs ``nth`` .. ``nth + count - 1``
(counted from now, inside an active :class:`faultfs.FaultFS`) fail with EIO.
Consecutive failures matter: a failed append is followed by the clean-up that
tries to take it back and by the reopen after it, and each may fail too. Each
failure follows Linux: by default the dirty pages are dropped and counted clean
(the process still reads them, the disk never gets them); with ``written`` they
reached the disk anyway and only the error is reported (writeback raced the
failure), the case where a failed write must be taken back or it comes back
after a crash. ``written`` applies to the first failure of the stretch; the
ones after it drop their pages, so a clean-up that fails leaves the disk as it
was.

``where`` (a log's path) counts only the fsyncs of that file towards ``nth``, and
with ``entry`` only those that make an entry of that event durable (the log's last
line when it is fsynced): the targeted EIO rule of the crash fuzzer fails the fsync
that decides an operation (a turn's ``turn.complete``, the user's
``message.delivered``) without knowing how many fsyncs come before it. The
failures after the first one hit the next fsyncs of any file, as without it.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from faultfs import FaultFS


@contextmanager
def failing_fsync(
    fs: FaultFS,
    nth: int,
    count: int = 1,
    *,
    written: bool = False,
    where: str | None = None,
    entry: str | None = None,
) -> Iterator[list[int]]:
    """Fail fsyncs ``nth`` .. ``nth + count - 1`` from now; yields ``[fsyncs so far]``.

    ``nth`` 0 fails nothing (it only counts). With ``where``, ``nth`` counts only
    the fsyncs of that path (of its ``entry`` appends, if given; the ``count``
    failures are its ``nth`` and the fsyncs of any file after it), and the count
    yielded starts at ``nth`` when it is reached.
    """
    assert nth >= 0 and count >= 1, (nth, count)
    real = os.fsync
    calls = [0]
    seen = [0]  # the fsyncs of ``where`` before the first failure

    def fsync(fd: Any) -> None:
        if where is not None and not calls[0]:
            if nth == 0 or _path(fs, fd) != where or not _last_entry_is(where, entry):
                real(fd)
                return
            seen[0] += 1
            if seen[0] < nth:
                real(fd)
                return
            calls[0] = nth - 1  # this one is the nth: count on from here
        calls[0] += 1
        if not nth <= calls[0] < nth + count or nth == 0:
            real(fd)
        elif written and calls[0] == nth:
            real(fd)
            raise OSError(errno.EIO, "Input/output error (the data was written back)")
        else:
            fs.fail_next_fsync()
            real(fd)

    os.fsync = fsync
    try:
        yield calls
    finally:
        os.fsync = real


def _path(fs: FaultFS, fd: Any) -> str | None:
    """The path of ``fd`` on ``fs`` (None for a descriptor it does not hold)."""
    try:
        return fs.fd_path(fd)
    except (OSError, KeyError, TypeError):
        return None


def _last_entry_is(path: str, event: str | None) -> bool:
    """Whether the last line of the log at ``path`` is an entry of ``event`` (None: any)."""
    if event is None:
        return True
    with open(path, "rb") as log:  # the simulated file: what the process sees
        size = log.seek(0, os.SEEK_END)
        log.seek(max(0, size - _TAIL))
        tail = log.read()
    lines = tail.rstrip(b"\n").rsplit(b"\n", 1)
    return f'"event":"{event}"'.encode() in lines[-1]


_TAIL = 1 << 16
"""How much of a log's end :func:`_last_entry_is` reads (an entry is rarely longer;
one that is, is not matched)."""
