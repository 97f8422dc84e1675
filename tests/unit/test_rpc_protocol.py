"""JSON-RPC framing and parsing: every malformed input becomes an error, never an exception."""

from __future__ import annotations

import errno
import json
import os
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from substrat import errors
from substrat.rpc import protocol
from substrat.rpc.protocol import LineFramer, Request, RequestError, parse_line, parse_message
from substrat.rpc.server import Method, Param, bind_params


def _error_code(item: Any) -> int:
    assert isinstance(item, dict), item
    return int(item["error"]["code"])


def test_valid_request_and_notification() -> None:
    items, is_batch = parse_line(b'{"jsonrpc":"2.0","method":"ping","id":7}')
    assert not is_batch
    assert items == [Request("ping", {}, 7, False)]
    items, _ = parse_line(b'{"jsonrpc":"2.0","method":"ping","params":[1]}')
    assert items == [Request("ping", [1], None, True)]


@pytest.mark.parametrize(
    ("line", "code", "echo_id"),
    [
        (b"{not json", protocol.PARSE_ERROR, None),
        (b"\xff\xfe", protocol.PARSE_ERROR, None),
        (b'{"jsonrpc":"2.0","method":"x","id":1,"p":NaN}', protocol.PARSE_ERROR, None),
        (b"[" * 100_000, protocol.PARSE_ERROR, None),
        (b"42", protocol.INVALID_REQUEST, None),
        (b"[]", protocol.INVALID_REQUEST, None),
        (b'{"jsonrpc":"1.0","method":"x","id":3}', protocol.INVALID_REQUEST, 3),
        (b'{"jsonrpc":"2.0","id":3}', protocol.INVALID_REQUEST, 3),
        (b'{"jsonrpc":"2.0","method":5,"id":3}', protocol.INVALID_REQUEST, 3),
        (b'{"jsonrpc":"2.0","method":"x","params":"s","id":"a"}', protocol.INVALID_REQUEST, "a"),
        (b'{"jsonrpc":"2.0","method":"x","id":true}', protocol.INVALID_REQUEST, None),
        (b'{"jsonrpc":"2.0","method":"x","id":{"a":1}}', protocol.INVALID_REQUEST, None),
        (b'{"jsonrpc":"2.0","method":"x","id":1.5}', protocol.INVALID_REQUEST, None),
    ],
)
def test_malformed_lines_get_the_right_error(line: bytes, code: int, echo_id: Any) -> None:
    items, _ = parse_line(line)
    assert len(items) == 1
    (error,) = items
    assert _error_code(error) == code
    assert isinstance(error, dict) and error["id"] == echo_id  # an error response, not a Request


def test_batch_mixes_requests_and_errors_and_is_bounded() -> None:
    line = json.dumps(
        [{"jsonrpc": "2.0", "method": "a", "id": 1}, 5, {"jsonrpc": "2.0", "method": "b"}]
    ).encode()
    items, is_batch = parse_line(line)
    assert is_batch
    assert isinstance(items[0], Request) and items[0].id == 1
    assert _error_code(items[1]) == protocol.INVALID_REQUEST
    assert isinstance(items[2], Request) and items[2].is_notification
    too_many = json.dumps([{"jsonrpc": "2.0", "method": "a", "id": i} for i in range(65)])
    items, is_batch = parse_line(too_many.encode())
    assert not is_batch and _error_code(items[0]) == protocol.INVALID_REQUEST


def test_framer_splits_lines_across_chunks_and_drops_oversized_ones() -> None:
    framer = LineFramer(max_line_bytes=10)
    out: list[bytes | None] = []
    for chunk in (b"abc", b"def\nxy", b"z\n\n", b"0123456789ABCDEF", b"GHI\nok\n"):
        out.extend(framer.feed(chunk))
    assert out == [b"abcdef", b"xyz", None, b"ok"]
    assert framer.partial_bytes == 0


@given(st.lists(st.binary(max_size=40), max_size=20), st.integers(min_value=1, max_value=64))
def test_framer_matches_a_reference_split(chunks: list[bytes], limit: int) -> None:
    framer = LineFramer(max_line_bytes=limit)
    got: list[bytes | None] = []
    for chunk in chunks:
        got.extend(framer.feed(chunk))
    data = b"".join(chunks)
    complete = data.split(b"\n")[:-1]
    expected: list[bytes | None] = []
    for line in complete:
        if len(line) > limit:
            expected.append(None)
        elif line.strip():
            expected.append(line)
    # An oversized unfinished tail is reported as soon as it goes over the limit.
    tail = data.split(b"\n")[-1]
    if len(tail) > limit:
        expected.append(None)
    assert got == expected


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300)
@given(st.one_of(st.binary(max_size=200), _json_values.map(lambda v: json.dumps(v).encode())))
def test_parse_line_never_raises_and_yields_requests_or_errors(line: bytes) -> None:
    items, _is_batch = parse_line(line)
    assert items
    for item in items:
        if isinstance(item, dict):
            assert item["jsonrpc"] == "2.0"
            assert isinstance(item["error"]["code"], int)
            protocol.encode(item)  # every error response is itself valid JSON
        else:
            assert isinstance(item.method, str) and item.method


@settings(max_examples=200)
@given(
    st.dictionaries(
        st.sampled_from(["jsonrpc", "method", "params", "id", "extra"]), _json_values, max_size=5
    )
)
def test_parse_message_handles_any_object(message: dict[str, Any]) -> None:
    parsed = parse_message(message)
    if isinstance(parsed, Request):
        assert message.get("jsonrpc") == "2.0"
        assert isinstance(message.get("method"), str)
        assert parsed.is_notification == ("id" not in message)
    else:
        assert "error" in parsed


async def _noop(call: Any) -> None:
    return None


METHOD = Method(
    "m",
    _noop,
    (
        Param("name", (str,), max_chars=5),
        Param("flag", (bool,), False, False),
        Param("count", (int,), False, 3),
    ),
)


def test_bind_params_by_name_and_position_with_defaults() -> None:
    assert bind_params(METHOD, {"name": "ab"}) == {"name": "ab", "flag": False, "count": 3}
    assert bind_params(METHOD, ["ab", True]) == {"name": "ab", "flag": True, "count": 3}
    assert bind_params(METHOD, {"name": "ab", "count": None}) == {
        "name": "ab",
        "flag": False,
        "count": 3,
    }


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"name": 5},
        {"name": "toolong"},
        {"name": "a", "count": True},
        {"name": "a", "flag": 1},
        {"name": "a", "bogus": 1},
        ["a", False, 1, "extra"],
    ],
)
def test_bind_params_rejects_bad_params(params: Any) -> None:
    with pytest.raises(RequestError) as info:
        bind_params(METHOD, params)
    assert info.value.code == protocol.INVALID_PARAMS


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (errors.AgentNotFoundError("x"), protocol.AGENT_NOT_FOUND),
        (errors.AgentBusyError("x"), protocol.AGENT_BUSY),
        (errors.NameCollisionError("x"), protocol.NAME_COLLISION),
        (errors.HasChildrenError("x"), protocol.HAS_CHILDREN),
        (errors.UnknownProviderError("x"), protocol.UNKNOWN_PROVIDER),
        (errors.ProviderError("x"), protocol.PROVIDER_FAILED),
        (errors.DurabilityError("x"), protocol.DURABILITY_FAILED),
        (errors.OutcomeUnknownError("x"), protocol.OUTCOME_UNKNOWN),
        (ValueError("bad name"), protocol.INVALID_PARAMS),
        (errors.BadInputError("the prompt is empty"), protocol.INVALID_PARAMS),
        (RuntimeError("bug"), protocol.INTERNAL_ERROR),
    ],
)
def test_exceptions_map_to_codes(exc: BaseException, code: int) -> None:
    got, message, data = protocol.error_for_exception(exc)
    assert got == code
    assert data["type"] == type(exc).__name__
    assert message


def test_a_lone_surrogate_escape_is_refused_and_a_pair_is_not() -> None:
    lone = b'{"jsonrpc":"2.0","id":1,"method":"m","params":{"prompt":"a\\uDCFF"}}'
    [refused], _ = parse_line(lone)
    assert isinstance(refused, dict)
    assert refused["error"]["code"] == protocol.INVALID_PARAMS
    assert (
        "invalid UTF-8 in the prompt: byte 0xff at line 1, column 2"
        in (refused["error"]["message"])
    )
    pair = b'{"jsonrpc":"2.0","id":2,"method":"m","params":{"prompt":"\\ud83d\\ude00"}}'
    [request], _ = parse_line(pair)
    assert isinstance(request, protocol.Request) and request.params == {"prompt": "\U0001f600"}


class _Text(str):
    pass


@pytest.mark.parametrize(
    ("params", "where"),
    [
        ({"prompt": "ok", "files": [{"name": "a\udcff"}]}, "files[0].name"),
        ({"x\udc80": 1}, "a parameter name"),
        (["fine", 2, None, ["b\ud800"]], "params[3][0]"),
        ({"prompt": _Text("a\udcff")}, "the prompt"),  # a subclass: the walk judges it
    ],
)
def test_a_lone_surrogate_anywhere_is_refused_with_its_place(params: Any, where: str) -> None:
    with pytest.raises(errors.BadInputError, match=re.escape(f"invalid UTF-8 in {where}: ")):
        protocol.check_text(params)


def test_text_that_encodes_is_passed_without_the_walk_that_names_places(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every prompt and request is checked: the walk (a generator per value, a path text
    per field) runs only for a refusal, which needs the field's name."""

    def walked(*_: Any) -> Any:
        raise AssertionError("walked")

    monkeypatch.setattr(protocol, "_texts", walked)
    protocol.check_text({"prompt": "caf\u00e9 \U0001f600", "n": 3, "x": [1.5, True, None]})


def _failed_append(code: int) -> errors.DurabilityError:
    try:
        raise errors.DurabilityError("append of entry 12 to x/events.jsonl failed") from OSError(
            code, os.strerror(code)
        )
    except errors.DurabilityError as exc:
        return exc


@pytest.mark.parametrize(
    ("exc", "code", "advice"),
    [
        (_failed_append(errno.ENOSPC), protocol.DURABILITY_FAILED, "free space"),
        (_failed_append(errno.EDQUOT), protocol.DURABILITY_FAILED, "quota is exceeded"),
        (_failed_append(errno.EFBIG), protocol.DURABILITY_FAILED, "raise `ulimit -f`"),
        (OSError(errno.EROFS, "Read-only file system"), protocol.DURABILITY_FAILED, "remount"),
        (
            PermissionError(errno.EACCES, "Permission denied", "x"),
            protocol.DURABILITY_FAILED,
            "access",
        ),
        (OSError(errno.EMFILE, "Too many open files"), protocol.DURABILITY_FAILED, "ulimit -n"),
        (OSError(errno.ENFILE, "Too many open files"), protocol.DURABILITY_FAILED, "system's"),
    ],
)
def test_io_failures_are_not_internal_errors_and_say_what_fixes_them(
    exc: BaseException, code: int, advice: str
) -> None:
    """Finding o18c-5/7: an I/O failure is -32011 (a plain OSError reaches the answer only
    from before a commit point), never -32603, and its message ends with the remedy."""
    got, message, _ = protocol.error_for_exception(exc, agents=3)
    assert got == code
    assert "internal error" not in message
    assert advice in message, message
