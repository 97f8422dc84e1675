"""A root whose files are hard links shared with another directory is refused.

``cp -al`` (or ``cp -l``, or a restore that links from a backup) makes a second
directory whose files are the first one's inodes. Two such roots are one set of
files under two names: each one's daemon appends to the other's logs (an
outside review saw a copy's turn appear in the original's history, and the
original's appends change the "backup"), and ``daemon.lock``, whose ``flock``
belongs to the inode, makes the daemon of one look like the other's: the copy's
commands named the original's daemon as their own, and ``daemon restart`` on the
copy, as advised, stopped it (SIGTERM) to start one that wrote into its logs.

Every command and the daemon check the two files a root always has at its top
level (the marker, written once, and the lock, never renamed) before anything
else, so neither root is used until one of them is a real copy.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from substrat.errors import RootUnusableError

LINKED_NAMES = ("substrat-root.json", "daemon.lock")
"""The root's own files that a copy made with hard links shares (never replaced by a
rename while the root is in use, so a link to them stays one)."""


def refuse_linked(root: str | os.PathLike[str]) -> None:
    """Raise RootUnusableError if ``root``'s marker or lock has another hard link."""
    path = Path(root).expanduser().absolute()
    for name in LINKED_NAMES:
        try:
            st = os.lstat(path / name)
        except OSError:
            continue  # missing (a new or legacy root) or unreadable: other checks say so
        if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
            raise RootUnusableError(
                f"{path} shares its files with another directory: its {name} has "
                f"{st.st_nlink} hard links (a copy made with `cp -al`, `cp -l` or another "
                "tool that links files), so the two would write the same logs and take "
                "each other's daemon for their own; make the other directory a real copy "
                "(`cp -a OTHER NEW && rm -rf OTHER`; `find / -xdev -samefile "
                f"{path / name}` finds it), then run the command again"
            )
