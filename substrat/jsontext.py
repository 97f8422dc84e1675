"""Decoding JSON text the way orjson does, without orjson's transient memory on big texts.

orjson (3.13, as measured here) parses a document into a complete intermediate
tree before it builds the Python objects, which for a document of a few
megabytes costs about fourteen times its size at the peak (a 2.5 MB checkpoint of the
user's inbox: 37 MiB for a moment, then 9 MiB kept). A daemon's peak RSS is
set by such moments. :func:`loads` decodes texts of ``BIG_TEXT_BYTES`` or more
with the standard library's parser instead (which builds the objects as it
reads, with no peak beyond them), under orjson's rules: no ``NaN`` or
``Infinity``, no float overflowing to infinity, integers beyond 64 bits read as
floats. Whatever it cannot decide that way (a surrogate escape, a parse error,
nesting too deep for it) goes to orjson itself, so the value returned, and every
error raised (``orjson.JSONDecodeError``), are orjson's, with one exception: a
big text nested deeper than orjson's 1,024 levels may be read (up to the
standard parser's own limit, which depends on the stack), where orjson refuses
it. substrat never writes one (``orjson.dumps`` refuses more than 254 levels),
so only a hand-made line, checksum and all, can tell the difference.

What substrat writes is held to the same rules before it is written
(:func:`check_plain_json`): a value that would read back as something else (an
integer beyond 64 bits as a float, a tuple as a list) is refused with the path
to it, so an event, a log's context or a session record reads back as written.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from typing import Any

import orjson

BIG_TEXT_BYTES = 256 << 10
"""Texts this long or longer are decoded by the standard library (see the module docstring)."""
MIN_INT = -(1 << 63)
MAX_INT = (1 << 64) - 1
"""Integers outside [MIN_INT, MAX_INT] are refused when written (:func:`check_plain_json`):
orjson, like many JSON readers, has none wider than 64 bits (it reads them as floats)."""
MAX_NESTING_DEPTH = 64
"""Plain JSON nests no deeper than this (:func:`check_plain_json`)."""
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")


class _Refused(ValueError):
    """A value orjson would refuse or read otherwise: orjson decides."""


def _reject_constant(name: str) -> Any:
    raise _Refused(name)


def _float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _Refused(text)
    return value


def _int(text: str) -> int | float:
    value = int(text)
    if MIN_INT <= value <= MAX_INT:
        return value
    return _float(text)  # orjson reads an integer beyond 64 bits as a float


_DECODER = json.JSONDecoder(
    parse_constant=_reject_constant, parse_float=_float, parse_int=_int, strict=True
)


def loads(data: bytes | str, *, big: int = BIG_TEXT_BYTES) -> Any:
    """``orjson.loads(data)``, with texts of ``big`` bytes or more decoded without its
    transient peak (see the module docstring)."""
    if len(data) < big:
        return orjson.loads(data)
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        if _SURROGATE_ESCAPE.search(text) is not None:
            raise _Refused("a surrogate escape")  # orjson refuses a lone one
        return _DECODER.decode(text)
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError too
        return orjson.loads(data)


def check_plain_json(value: object, where: str = "data") -> None:
    """Raise TypeError unless ``value`` is made only of plain JSON types.

    Plain means dict (str keys), list, str, int (within 64 bits), finite float,
    bool and None. Tuples, sets, bytes, UUIDs and other objects are refused: the
    log must read back as exactly what was written, in any version and any
    language (many JSON readers, orjson among them, have no integers wider
    than 64 bits).
    """
    if _plain(value, 0):
        return  # every append checks its data: the path to a refused value is named below
    stack: list[tuple[object, str, int]] = [(value, where, 0)]
    while stack:
        item, path, depth = stack.pop()
        if depth > MAX_NESTING_DEPTH:
            raise TypeError(f"{path}: nested deeper than {MAX_NESTING_DEPTH} levels")
        if item is None or isinstance(item, (str, bool)):
            continue
        if isinstance(item, int):
            if not MIN_INT <= item <= MAX_INT:
                raise TypeError(f"{path}: {item} does not fit in 64 bits; store it as a string")
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                raise TypeError(f"{path}: {item!r} is not representable in JSON")
            continue
        if type(item) is dict:
            for key, sub in item.items():
                if not isinstance(key, str):
                    raise TypeError(f"{path}: key {key!r} is not a string")
                stack.append((sub, f"{path}.{key}", depth + 1))
            continue
        if type(item) is list:
            for index, sub in enumerate(item):
                stack.append((sub, f"{path}[{index}]", depth + 1))
            continue
        raise TypeError(
            f"{path}: {type(item).__name__} is not a plain JSON type; convert it "
            "(UUIDs to hex strings, times to ISO 8601 strings, tuples to lists)"
        )


def _plain(item: object, depth: int) -> bool:
    """Whether :func:`check_plain_json` accepts ``item`` at ``depth``, by the same rules,
    without the path text it formats for every value (a tenth of an append's CPU).

    A member of the commonest kinds (a string, an integer, None, a bool: exactly those
    types) is judged in its container's loop, without a call of its own; a container,
    a float or anything else (a subclass) goes through a call."""
    if depth > MAX_NESTING_DEPTH:
        return False
    kind = type(item)
    members: Iterable[object]
    if kind is dict:
        for key in item:  # type: ignore[attr-defined]
            if type(key) is not str and not isinstance(key, str):
                return False
        members = item.values()  # type: ignore[attr-defined]
    elif kind is list:
        members = item  # type: ignore[assignment]
    elif item is None or isinstance(item, (str, bool)):
        return True
    elif isinstance(item, int):
        return MIN_INT <= item <= MAX_INT
    elif isinstance(item, float):
        return math.isfinite(item)
    else:
        return False
    if depth == MAX_NESTING_DEPTH:  # no member fits one level down
        return not item
    for sub in members:
        kind = type(sub)
        if kind is str or sub is None or kind is bool:
            continue
        if kind is int:
            if MIN_INT <= sub <= MAX_INT:  # type: ignore[operator]
                continue
            return False
        if not _plain(sub, depth + 1):
            return False
    return True
