"""A tiny stand-alone "notes" store: the kind of code another project would test.

It knows nothing of faultfs or substrat; it uses plain open, json.dump and
os.replace. ``save_naive`` is the version many programs ship (no fsync);
``save`` is the durable one.
"""

from __future__ import annotations

import json
import os
from typing import Any


def save_naive(path: str, notes: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as handle:
        json.dump(notes, handle)
    os.replace(tmp, path)


def save(path: str, notes: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as handle:
        json.dump(notes, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fd = os.open(os.path.dirname(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load(path: str) -> dict[str, Any]:
    try:
        with open(path) as handle:
            notes: dict[str, Any] = json.load(handle)
            return notes
    except FileNotFoundError:
        return {}
