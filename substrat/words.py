"""Small helpers for text people read: counts with the right plural, times."""

from __future__ import annotations

import functools
import re
from datetime import UTC, datetime

_DIGITS = re.compile(r"\d+")


def plural(count: int, singular: str, plural_form: str | None = None) -> str:
    """``"1 live child"``, ``"2 live children"``; the plural defaults to ``singular + "s"``."""
    many = plural_form if plural_form is not None else singular + "s"
    return f"{count} {singular if count == 1 else many}"


@functools.lru_cache(maxsize=1 << 16)
def natural_key(name: str) -> tuple[str, str]:
    """Sorts names as people count: ``c2`` before ``c10``. Each run of digits becomes its
    length (two digits) and the number, so plain text comparison (fast, in C) orders
    numbers by value; names equal that way (``c01``, ``c1``) by their text."""
    return _DIGITS.sub(_by_value, name), name


def _by_value(run: re.Match[str]) -> str:
    digits = run.group().lstrip("0") or "0"
    return f"{len(digits):02d}{digits}"


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
