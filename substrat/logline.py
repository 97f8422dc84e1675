"""One line of the log format: a checksummed JSON object (see :mod:`substrat.eventlog`).

Every file substrat writes in the log format (an event log, the checkpoint store,
a log's base and start record) encodes its lines with :func:`encode_entry` and
decodes them with :func:`decode_line`; the readers of whole logs are in
:mod:`substrat.logread`.
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Mapping
from typing import Any

import orjson

from substrat import persistence
from substrat.jsontext import BIG_TEXT_BYTES, loads

Entry = dict[str, Any]
CRC_PREFIX = b'{"crc":"'
CRC_HEX_END = len(CRC_PREFIX) + 8
BODY_START = CRC_HEX_END + 2  # past '",'
CRC_OF_OPEN_BRACE = zlib.crc32(b"{")


def encode_entry(body: Mapping[str, Any]) -> bytes:
    """Serialise one entry (without ``crc``) into a checksummed log line.

    The body must be plain JSON (see :func:`substrat.eventlog.check_plain_json`); anything the
    codec cannot write exactly raises TypeError.
    """
    payload = orjson.dumps(body)
    crc = zlib.crc32(payload)
    return b'{"crc":"%08x",' % crc + payload[1:] + b"\n"


def decode_line(line: bytes, end: int | None = None, *, one_string: bool = False) -> Entry | str:
    """Decode one line (without its newline): the entry, or the kind of damage.

    ``end``: the line is ``line[:end]`` (its newline left where it was read, not cut
    off with a copy: a checkpoint of a large inbox is megabytes). ``one_string``: the
    line is a few members and one long string (a checkpoint's line in its store: its
    facts are JSON text), which orjson decodes with no peak beyond the string, so a big
    one is decoded by orjson too; its entry is the same but for a ``crc`` member the
    line would repeat (none that substrat writes does)."""
    size = len(line) if end is None else end
    if line.startswith(CRC_PREFIX) and size > BODY_START and line[CRC_HEX_END:BODY_START] == b'",':
        try:
            expected = int(line[len(CRC_PREFIX) : CRC_HEX_END], 16)
        except ValueError:
            expected = -1
        # The checksum covers '{' + the line after the crc member; seeding the
        # CRC with '{' spares copying the line.
        rest = memoryview(line)[BODY_START:size]
        if zlib.crc32(rest, CRC_OF_OPEN_BRACE) == expected:
            try:
                if len(rest) + 1 < BIG_TEXT_BYTES:
                    entry = orjson.loads(b"{" + rest)
                elif one_string:  # read in place, its crc member too: no copy of the line
                    # (the user's inbox of 9,900 messages: 4.6 ms, not the 18 below)
                    entry = orjson.loads(memoryview(line)[:size])
                    if isinstance(entry, dict):
                        del entry["crc"]
                else:  # a big line (a checkpoint of a large inbox) without orjson's peak,
                    # its text decoded once from the line (each copy is megabytes of pages)
                    entry = loads("{" + str(rest, "utf-8"), big=0)
            except (orjson.JSONDecodeError, UnicodeDecodeError):
                return "invalid_json"
            if isinstance(entry, dict) and isinstance(entry.get("seq"), int):
                return entry
            return "invalid_json"
    return _classify_damage(line if end is None else line[:end])


def _classify_damage(line: bytes) -> str:
    if b"\x00" in line:
        return "nul_bytes"
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return "invalid_utf8"
    try:
        parsed = json.loads(text)
    except ValueError:
        return "invalid_json"
    if isinstance(parsed, dict) and "crc" in parsed:
        return "bad_checksum"
    return "missing_checksum"


class RecordUnreadable(ValueError):
    """A one-line record file is there but does not read (damaged, or another event)."""


def read_record(path: str | os.PathLike[str], event: str) -> Entry | None:
    """The entry of a file written atomically as one line of event ``event`` (a log's
    base, its start record); None if there is no such file."""
    try:
        raw = persistence.read_bytes(path)
    except FileNotFoundError:
        return None
    except IsADirectoryError:  # what it said is as lost as a damaged line's
        raise RecordUnreadable(f"{path} is not a file (a directory is in its place)") from None
    entry = decode_line(raw[:-1]) if raw.endswith(b"\n") else "torn_tail"
    if isinstance(entry, str):
        raise RecordUnreadable(f"{path} is damaged ({entry})")
    if entry.get("event") != event:
        raise RecordUnreadable(f"{path} holds a {entry.get('event')!r} entry")
    return entry
