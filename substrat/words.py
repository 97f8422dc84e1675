"""Small helpers for text people read: counts with the right plural, times."""

from __future__ import annotations

import functools
import re
from datetime import UTC, datetime

_DIGITS = re.compile(r"(\d+)")


def plural(count: int, singular: str, plural_form: str | None = None) -> str:
    """``"1 live child"``, ``"2 live children"``; the plural defaults to ``singular + "s"``."""
    many = plural_form if plural_form is not None else singular + "s"
    return f"{count} {singular if count == 1 else many}"


@functools.lru_cache(maxsize=1 << 16)
def natural_key(name: str) -> tuple[tuple[str | int, ...], str]:
    """Sorts names as people count: ``c2`` before ``c10`` (the digits compared as numbers,
    the rest as text; names equal that way, ``c01`` and ``c1``, by their text)."""
    parts = _DIGITS.split(name)
    return tuple(int(p) if i % 2 else p for i, p in enumerate(parts)), name


def when(iso: str | None) -> str:
    """An ISO 8601 UTC timestamp as people read it: ``2030-01-02 03:04:05 UTC``."""
    if not iso:
        return "an unknown time"
    try:
        moment = datetime.fromisoformat(iso)
    except ValueError:
        return iso
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
