"""The root marker, ``substrat-root.json``: what format of root this is.

Format 1 is what substrat wrote before log segments, archives and bases, checkpoint
format 2 and start summary format 3 (before 2026-11-28). Format 2 is a root this code
may have written those into. A version that knows the marker refuses a format newer than
its own ("upgrade substrat"), and that refusal is the only thing that keeps it from
misreading a root: a version from before segments takes a live agent whose
``agent.created`` is in a sealed segment for a crashed creation and terminates it. So
every process that writes to a root, once it holds the root and before its first write,
raises a format-1 marker to format 2 (:func:`upgrade`): a root this code has written to is
never marked as one an older version reads right. Reading leaves the marker as it is.

A root without a marker (a library's, or one from before the marker) is left without one
here: :mod:`substrat.rootdir` decides where a marker is written at all.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from substrat import __version__, persistence
from substrat.rootnest import MARKER_NAME
from substrat.timestamps import utc_now_iso

MARKER_FORMAT = "substrat-root"
MARKER_VERSION = 2
"""The newest root format this code reads and writes (see the module docstring)."""
MAX_MARKER_BYTES = 4096


def read(root: str | os.PathLike[str]) -> dict[str, object] | None:
    """The marker's fields, or None when it is missing, unreadable or not a JSON object."""
    try:
        with open(Path(root) / MARKER_NAME, "rb") as handle:
            body = json.loads(handle.read(MAX_MARKER_BYTES))
    except (OSError, ValueError):
        return None
    return body if isinstance(body, dict) else None


def version_of(body: dict[str, object] | None) -> int | None:
    version = body.get("version") if body is not None else None
    return version if isinstance(version, int) and not isinstance(version, bool) else None


def write(root: str | os.PathLike[str], *, created: dict[str, object] | None = None) -> None:
    """Write the marker at :data:`MARKER_VERSION` durably (temp file, fsync, rename, fsync
    of the root). ``created``: an older marker whose ``created_at``/``created_by`` are kept
    (the root was made then, by that version). OSError if it cannot be written."""
    body: dict[str, object] = {
        "format": MARKER_FORMAT,
        "version": MARKER_VERSION,
        "created_at": utc_now_iso(),
        "created_by": f"substrat {__version__}",
    }
    if created is not None:
        for key in ("created_at", "created_by"):
            if isinstance(created.get(key), str):
                body[key] = created[key]
        body["upgraded_from"] = version_of(created)
    persistence.atomic_write(Path(root) / MARKER_NAME, json.dumps(body).encode() + b"\n")


def upgrade(root: str | os.PathLike[str]) -> bool:
    """Raise an older marker to :data:`MARKER_VERSION` (True if it was). Call it holding
    the root, before the first write (beside ``start_summary.retire``): a process refused
    the root (a daemon serves it) must leave an older version's root as it was. A root
    without a marker, or with one that does not read, is left alone. On a file system
    mounted read-only nothing can be written either: the marker stays (OSError otherwise,
    and the caller must not write)."""
    body = read(root)
    version = version_of(body)
    if version is None or version >= MARKER_VERSION:
        return False
    try:
        write(root, created=body)
    except OSError:
        if persistence.on_read_only_fs(str(root)):
            return False
        raise
    return True
