"""The daemon stops when its root's path no longer names the directory it serves.

The daemon opens its files by path (``<root>/agents/<id>/session.json``, a new
agent's directory, a log it had not opened yet), while the logs it has open are
written through their descriptors. So a root moved, renamed, removed or
replaced while its daemon runs splits the daemon in two: what it appends goes
with the old directory (or into a file the move deleted, for a move to another
file system, where ``mv`` copies and then removes), and what it opens by path
goes to whatever the old path names now, which may be another root with its
own daemon. An outside review did each of these: a spawn and an inbox message
written into the new root made at the old path, and a turn acknowledged after
a move to another file system that the moved root did not have.

A daemon cannot serve a root under two names, so it does what a kill would do:
it stops at once, writing nothing more (a clean stop writes by path too), and
the next start at the root's new path recovers it as after a crash. A backup
restored over the running root is the same split (the restored files are new
inodes, the daemon appends to the old ones): the root's marker, replaced with
them, tells it (:meth:`RootGuard.note_marker`). Nothing
acknowledged is lost, because the check runs before every answer is sent: a
turn committed after the move is reported to its client as the daemon's death
(outcome unknown), never as committed. The check also runs every
:data:`CHECK_EVERY_S` seconds (:data:`CHECK_ENV` sets another interval), so a daemon
whose root went away does not live on unseen (no command finds it by the old path,
and it would write into a root made there later). A symlink given as the root is
resolved when the daemon starts (``Daemon``), so repointing the link is not a move of the root.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Literal, NamedTuple

from substrat.rootnest import MARKER_NAME

log = logging.getLogger(__name__)

CHECK_EVERY_S = 1.0
"""How often a serving daemon checks its root's path (a stat: about 2 microseconds)."""

CHECK_ENV = "SUBSTRAT_ROOT_CHECK_S"
"""Sets :data:`CHECK_EVERY_S` for a daemon (seconds, :data:`CHECK_RANGE_S`). The check before
every answer does not depend on it; only how soon a daemon whose root went away while
nobody asked it anything notices. Tests that wait for that set it low (a wait of up to a
second each, for nothing the test checks)."""

CHECK_RANGE_S = (0.01, 60.0)


def check_every_s(env: Mapping[str, str]) -> float:
    """The interval :data:`CHECK_ENV` in ``env`` asks for (:data:`CHECK_EVERY_S` if unset).

    Raises ValueError saying what to set when it is not a number in :data:`CHECK_RANGE_S`."""
    text = env.get(CHECK_ENV, "").strip()
    if not text:
        return CHECK_EVERY_S
    low, high = CHECK_RANGE_S
    try:
        every_s = float(text)
    except ValueError:
        every_s = float("nan")
    if not low <= every_s <= high:  # nan fails too
        raise ValueError(
            f"{CHECK_ENV}={text!r} is not a number of seconds from {low:g} to {high:g}; "
            f"set one, or unset it for the default ({CHECK_EVERY_S:g} s)"
        )
    return every_s


EXIT_ROOT_GONE = 1
"""The daemon's exit status when it stops for this (1: it did not stop cleanly)."""


ProblemKind = Literal["gone", "unreadable", "moved", "marker_replaced"]
"""What happened to the root: its path names nothing (``gone``), cannot be checked
(``unreadable``), names another directory (``moved``), or its marker was replaced or
removed in place (``marker_replaced``: a backup restored over the running root)."""


class RootProblem(NamedTuple):
    """Why the root's path no longer names the root: a kind to act on, a message to log."""

    kind: ProblemKind
    message: str


def _identity(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return (st.st_dev, st.st_ino)


class RootGuard:
    """What ``root`` named when the daemon took it: its device and inode (and its
    marker's, once :meth:`note_marker` ran)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._paths = (os.fspath(root), os.fspath(root / MARKER_NAME))  # built once: per answer
        self.identity = _identity(self._paths[0])
        self.marker: tuple[int, int] | None = None

    def note_marker(self) -> None:
        """Watch the root's marker too, from now on: called once the root is open (the
        open may raise an older marker, by a rename). Nothing rewrites it while a daemon
        holds the root, but a backup restored over the running root (``tar -x`` in it)
        replaces it, as it replaces the logs the daemon appends to through descriptors:
        the root directory itself stays, so its inode alone would not tell."""
        with contextlib.suppress(OSError):
            # kept open, so its inode number is not handed to the file a restore puts in
            # its place (tar unlinks, then creates: a freed number is reused at once)
            fd = os.open(self._paths[1], os.O_RDONLY | os.O_CLOEXEC)
            st = os.fstat(fd)
            self.marker = (st.st_dev, st.st_ino)

    def problem(self) -> RootProblem | None:
        """Why the root's path no longer names the root (None: it does)."""
        try:
            identity = _identity(self._paths[0])
        except FileNotFoundError:
            return RootProblem(
                "gone", f"{self.root} no longer exists (the root was moved, renamed or removed)"
            )
        except OSError as exc:
            return RootProblem("unreadable", f"{self.root} cannot be checked ({exc})")
        if identity != self.identity:
            return RootProblem(
                "moved",
                f"{self.root} now names another directory (the root was moved or replaced, "
                "e.g. restored from a backup, while its daemon ran)",
            )
        if self.marker is None:
            return None
        try:
            marker: tuple[int, int] | None = _identity(self._paths[1])
        except OSError:
            marker = None
        if marker != self.marker:
            return RootProblem(
                "marker_replaced",
                f"its marker {MARKER_NAME} was replaced or removed (a backup restored over the "
                "running root?), so the files this daemon has open are not the root's any more",
            )
        return None

    def enforce(self) -> None:
        """Stop the process at once if the root's path no longer names the root."""
        found = self.problem()
        if found is None:
            return
        why = found.message
        log.error(
            "stopping without a clean shutdown: %s; this daemon writes nothing more (it would "
            "write at the old path). Nothing acknowledged is lost: start the daemon on the "
            "root's path (`substrat daemon start --root PATH`), which recovers it",
            why,
        )
        for handler in logging.getLogger().handlers:
            handler.flush()
        if found.kind == "marker_replaced":  # the directory is still the root: see below
            _tell_restored_log(self.root, why)
        # as a kill would: every acknowledged operation is already durable, and any
        # clean-stop write (session records, checkpoints) would land at the old path
        os._exit(EXIT_ROOT_GONE)

    async def watch(self, every_s: float = CHECK_EVERY_S) -> None:
        """Check every ``every_s`` seconds until cancelled."""
        while True:
            await asyncio.sleep(every_s)
            self.enforce()


RESTORED_LOG_WAIT_S = 5.0
"""How long a daemon stopped by a restore waits for it to replace ``daemon.log`` too."""


def _tell_restored_log(root: Path, why: str, wait_s: float = RESTORED_LOG_WAIT_S) -> None:
    """Say why in the ``daemon.log`` the root has now, too: a restore replaced the one
    this process writes to (its stderr), where nobody would read it. Only when the
    directory is still the root (its files were replaced, it was not moved): the old
    path of a moved root may be another root's by now.

    The restore may not have reached ``daemon.log`` yet when the marker tells (``tar``
    extracts in the archive's order, and the marker may come first; a landing run at
    load 15 lost the line so): until ``wait_s`` has passed it waits for the file there
    to be another one, then appends. One that stays this process's stderr already has
    the line."""
    path = root / "daemon.log"
    deadline = time.monotonic() + wait_s
    with contextlib.suppress(OSError):
        while True:
            try:
                if not os.path.samestat(os.stat(path), os.fstat(2)):
                    break
            except FileNotFoundError:
                pass  # between a restore's unlink and its create
            if time.monotonic() >= deadline:
                return
            time.sleep(0.05)
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(f"substrat daemon pid {os.getpid()} stopped: {why}\n")
