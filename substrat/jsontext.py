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
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import orjson

BIG_TEXT_BYTES = 256 << 10
"""Texts this long or longer are decoded by the standard library (see the module docstring)."""
_MIN_INT = -(1 << 63)
_MAX_INT = (1 << 64) - 1
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
    if _MIN_INT <= value <= _MAX_INT:
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
