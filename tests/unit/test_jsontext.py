"""substrat.jsontext: orjson's answers, without orjson's transient peak on big texts.

* For any text, ``loads`` gives what ``orjson.loads`` gives, or raises
  ``orjson.JSONDecodeError`` when it does (the standard library's parser is
  forced on every text with ``big=0``): NaN, Infinity, an overflowing float,
  integers past 64 bits, lone and paired surrogate escapes, invalid UTF-8
  (nesting past orjson's 1,024 levels, the one documented difference, is not
  drawn: substrat's writer cannot produce it).
* A big checkpoint (a large inbox) is decoded, by ``Checkpoint.load_facts``
  and by the store's line decoder, with a peak near what it keeps (the line's
  own copies aside); orjson's parse peaked at 4 and 16 times that (a
  10,000-agent root's daemon reached 109 MiB by it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tracemalloc
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from substrat.checkpoints import Checkpoint, LogPoint
from substrat.eventlog import decode_line, encode_entry
from substrat.facts import AgentFacts
from substrat.jsontext import BIG_TEXT_BYTES, MAX_NESTING_DEPTH, check_plain_json, loads

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(1 << 70), max_value=1 << 70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8)
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=12,
)


def _outcome(decode: Callable[[Any], Any], data: bytes | str) -> tuple[str, Any]:
    try:
        return "value", decode(data)
    except orjson.JSONDecodeError:
        return "error", None


def _same(data: bytes | str) -> None:
    kind, value = _outcome(lambda d: loads(d, big=0), data)
    want_kind, want = _outcome(orjson.loads, data)
    assert kind == want_kind, (data, value, want)
    # repr: NaN is never equal to itself, and -0.0 == 0 would hide a type change
    assert repr(value) == repr(want), data


@given(_values, st.booleans())
@example(float("nan"), False)
@example(1 << 64, False)
@example(-(1 << 63) - 1, False)
@example("\ud800", True)
@example("\U0001f600", True)
def test_the_standard_parser_answers_as_orjson_does(value: Any, ascii_only: bool) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only)  # NaN, Infinity, \u escapes, big ints
    _same(text)
    _same(text.encode("utf-8", "surrogatepass"))


@given(st.binary(max_size=40) | st.text(max_size=40).map(lambda t: t.encode("utf-8")))
@example(b'{"a":1e400}')
@example(b'{"a":-Infinity}')
@example(b"\xef\xbb\xbf{}")
@example(b'["\xff"]')
@example(b'{"a":1}  ')
@example(b'{"a":"\\ud83d\\ude00"}')
def test_any_text_decodes_or_fails_as_with_orjson(data: bytes) -> None:
    _same(data)


def _peak_over_kept(work: Callable[[], Any]) -> tuple[float, Any]:
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        value = work()
        kept, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return (peak - before) / max(1, kept - before), value


def _big_inbox_checkpoint() -> Checkpoint:
    facts = AgentFacts("user")
    for i in range(6000):
        facts.enqueued[f"{i:032x}"] = {
            "message_id": f"{i:032x}",
            "sender": f"{i + 1:032x}",
            "recipient": "user",
            "kind": "result",
            "payload": f"done: agent-{i}",
            "timestamp": "2026-01-01T00:00:00.000000+00:00",
            "reply_to": None,
            "metadata": {"turn_id": "t49"},
        }
    text = orjson.dumps(facts.to_dict()).decode()
    assert len(text) > BIG_TEXT_BYTES
    return Checkpoint("user", LogPoint(1, 1, 0, 10, "00000000", 10, 0), text)


def test_a_big_checkpoints_facts_decode_without_a_transient_peak() -> None:
    checkpoint = _big_inbox_checkpoint()
    ratio, facts = _peak_over_kept(checkpoint.load_facts)
    assert len(facts.enqueued) == 6000
    assert ratio < 1.5, f"decoding peaked at {ratio:.1f}x what it keeps"


def _store_line() -> tuple[bytes, dict[str, Any]]:
    checkpoint = _big_inbox_checkpoint()
    body = {"seq": 1, "endpoint": "checkpoints", "ts": "t", "event": "checkpoint"}
    entry = {**body, "data": checkpoint.data()}
    return encode_entry(entry)[:-1], entry


def test_a_big_store_line_decodes_without_a_transient_peak() -> None:
    line, want = _store_line()
    ratio, entry = _peak_over_kept(lambda: decode_line(line))
    assert entry == want  # without its crc member
    # the line's own copies (body, text) stay; orjson's parse tree was 16x
    assert ratio < 5, f"decoding peaked at {ratio:.1f}x what it keeps"


_TOUCHED = """
import resource, sys
from substrat.eventlog import decode_line
line = open(sys.argv[1], "rb").read()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
entry = decode_line(line, one_string=sys.argv[2] == "1")
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(faults * resource.getpagesize(), len(entry["data"]["facts"]))
"""


def test_a_big_store_line_read_as_one_string_touches_no_more_than_the_standard_read(
    tmp_path: Path,
) -> None:
    """orjson reserves far more than it keeps for a line of one long string (14x here, as
    tracemalloc counts it) but touches fewer pages than the standard parser's read (the
    pages a fresh process faults in while it decodes): about the line's own copies, so a
    10,000-agent start's peak did not move (docs/benchmarks.md, the sixteenth pass)."""
    line, want = _store_line()
    path = tmp_path / "line"
    path.write_bytes(line)
    touched = {}
    for one_string in ("0", "1"):
        out = subprocess.run(
            [sys.executable, "-c", _TOUCHED, os.fspath(path), one_string],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        touched[one_string], kept = int(out[0]), int(out[1])
        assert kept == len(want["data"]["facts"])
    assert touched["1"] < min(touched["0"], 3 * len(line)), touched


@pytest.mark.parametrize("size", [BIG_TEXT_BYTES - 1, BIG_TEXT_BYTES])
def test_texts_either_side_of_the_bound_read_the_same(size: int) -> None:
    head = '{"pad":"'
    text = head + "x" * (size - len(head) - 2) + '"}'
    assert len(text) == size
    assert loads(text) == loads(text.encode()) == orjson.loads(text)


def _nested(levels: int, leaf: object) -> object:
    value = leaf
    for level in range(levels):
        value = [value] if level % 2 else {"k": value}
    return value


@pytest.mark.parametrize("leaf", ["text", 7, None])
def test_a_value_nested_to_the_limit_is_plain_and_one_level_more_is_refused(leaf: object) -> None:
    # a string leaf is judged without a call of its own: its level still counts
    check_plain_json(_nested(MAX_NESTING_DEPTH, leaf))
    with pytest.raises(TypeError, match="nested deeper"):
        check_plain_json(_nested(MAX_NESTING_DEPTH + 1, leaf))


@pytest.mark.parametrize("one_string", [False, True])
@pytest.mark.parametrize("pad", [10, BIG_TEXT_BYTES])
def test_a_line_reads_the_same_cut_or_with_its_newline_left(pad: int, one_string: bool) -> None:
    line = encode_entry({"seq": 3, "event": "x", "data": {"pad": "y" * pad}})
    assert line.endswith(b"\n")
    cut = decode_line(line[:-1])
    assert isinstance(cut, dict) and cut["data"]["pad"] == "y" * pad
    assert decode_line(line, len(line) - 1, one_string=one_string) == cut
    assert decode_line(line[:-1], one_string=one_string) == cut
    damaged = line[:20] + b"Z" + line[21:]
    assert decode_line(damaged, len(line) - 1, one_string=one_string) == "bad_checksum"
    assert decode_line(damaged[:-1], one_string=one_string) == "bad_checksum"


def _checksummed(body: bytes) -> bytes:
    """A line of ``body`` (a member list and the closing brace) with its valid checksum."""
    return b'{"crc":"%08x",' % zlib.crc32(body, zlib.crc32(b"{")) + body


@pytest.mark.parametrize("one_string", [False, True])
@pytest.mark.parametrize("pad", [10, BIG_TEXT_BYTES])
def test_a_line_of_invalid_utf8_with_a_valid_checksum_is_invalid_json(
    pad: int, one_string: bool
) -> None:
    line = _checksummed(b'"seq":1,"pad":"' + b"\xff" * pad + b'"}')
    assert decode_line(line, one_string=one_string) == "invalid_json"
    assert decode_line(line + b"\n", len(line), one_string=one_string) == "invalid_json"


@pytest.mark.parametrize(
    "body",
    [
        b'"seq":1,"pad":"%s"',  # no closing brace
        b'"seq":1,"pad":"%s"}}',  # one too many
        b'"seq":"1","pad":"%s"}',  # a seq that is no number
        b'"seq":1,"pad":"%s","nan":NaN}',
        b'"seq":1,"pad":"%s","lone":"\\ud800"}',
    ],
)
def test_a_big_line_decodes_or_fails_the_same_read_as_one_string(body: bytes) -> None:
    """What the one-string read (orjson, the line in place) makes of a big line with a valid
    checksum is what the standard parser's read makes of it: the entry, or invalid_json."""
    line = _checksummed(body % (b"p" * BIG_TEXT_BYTES))
    assert decode_line(line, one_string=True) == decode_line(line)
