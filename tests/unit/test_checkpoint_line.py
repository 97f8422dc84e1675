"""A checkpoint's line check: the quick check a start makes agrees with decoding the line.

``checkpoints.line_mismatch`` accepts the line read where a checkpoint says
its entry is without decoding it (checksum, the checkpoint's CRC and ``seq``
at the head of the line); anything else is decoded to say why. Over drawn
entries, each damaged in one way (a byte flipped, the line cut short, the
checkpoint pointing at another seq, CRC or length, keys in another order),
it holds exactly when the full decoding check holds.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from substrat.checkpoints import LogPoint, line_mismatch
from substrat.eventlog import decode_line, encode_entry

_data = st.dictionaries(
    st.sampled_from(["turn_id", "prompt", "agent_id"]), st.text(max_size=30), max_size=3
)


def _decoded_check(at: LogPoint, line: bytes) -> bool:
    """The check as it was: decode the line, compare its seq and CRC."""
    if len(line) != at.length or not line.endswith(b"\n"):
        return False
    entry = decode_line(line[:-1])
    return (
        not isinstance(entry, str)
        and entry["seq"] == at.seq
        and line[8:16].decode("ascii", "replace") == at.crc
    )


@given(
    seq=st.integers(min_value=1, max_value=10**12),
    data=_data,
    damage=st.sampled_from(["none", "flip", "cut", "seq", "crc", "length", "order"]),
    where=st.integers(min_value=0, max_value=10**6),
    other=st.integers(min_value=1, max_value=10**12),
)
def test_the_quick_check_holds_exactly_when_decoding_does(
    seq: int, data: dict[str, Any], damage: str, where: int, other: int
) -> None:
    body = {"seq": seq, "session_id": "a" * 32, "ts": "t", "event": "turn.start", "data": data}
    line = encode_entry(body)
    at = LogPoint(seq, 1, 0, len(line), line[8:16].decode(), len(line), 0)
    if damage == "flip":
        i = where % len(line)
        line = line[:i] + bytes([line[i] ^ (1 + where % 255)]) + line[i + 1 :]
    elif damage == "cut":
        line = line[: where % len(line)]
    elif damage == "seq" and other != seq:
        at = LogPoint(other, 1, 0, at.length, at.crc, at.prefix_bytes, 0)
    elif damage == "crc":
        at = LogPoint(seq, 1, 0, at.length, f"{other % (1 << 32):08x}", at.prefix_bytes, 0)
    elif damage == "length":
        at = LogPoint(seq, 1, 0, at.length + 1 + where % 7, at.crc, at.prefix_bytes, 0)
    elif damage == "order":  # the same entry, seq not first: only decoding tells
        line = encode_entry({"session_id": "a" * 32, **body})
        at = LogPoint(seq, 1, 0, len(line), line[8:16].decode(), len(line), 0)
    assert (line_mismatch(at, line) is None) == _decoded_check(at, line)
