"""JSON-RPC 2.0 over newline-delimited JSON: framing, parsing, error codes.

One message per line, UTF-8, no embedded newlines (``json.dumps`` never emits
one). A line is a request, a notification (a request without ``id``), or a
batch (a JSON array of them). Everything here is pure: no sockets, no asyncio,
so the parser can be fuzzed on its own.

Parsing never raises on input: each problem becomes an error response that the
server sends back (with ``id`` null when the id could not be read), and the
connection carries on with the next line.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any, NamedTuple

from substrat import errors, oserrors

JSONRPC_VERSION = "2.0"

MAX_REQUEST_BYTES = 2 << 20
"""Longest request line the daemon reads (a prompt may be up to the 1 MiB log entry)."""
MAX_BATCH_ITEMS = 64
MAX_METHOD_CHARS = 128
MAX_ID_CHARS = 256
"""Longest prompt a turn takes (``agent.send``; the CLI checks it before sending)."""

# The notifications a client can subscribe to (``events.subscribe``; docs/rpc.md). They
# are here, with the wire's other fixed values, so that a client need not load the
# daemon's side (the CLI starts in a fraction of the time without it).
ORCHESTRATOR_EVENTS = (
    "turn.started",
    "turn.tool",
    "turn.retrying",
    "turn.completed",
    "turn.failed",
    "agent.created",
    "agent.terminated",
    "message.enqueued",
    "message.delivered",
)
DAEMON_EVENTS = ("daemon.recovered", "daemon.heartbeat", "daemon.stopping")
EVENT_NAMES = frozenset(ORCHESTRATOR_EVENTS + DAEMON_EVENTS)

# Codes fixed by the JSON-RPC 2.0 specification.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603

# Server-defined codes (the -32000..-32099 range); docs/rpc.md lists them.
SUBSTRAT_ERROR = -32000
AGENT_NOT_FOUND = -32001
AGENT_BUSY = -32002
NAME_COLLISION = -32003
TOO_MANY_TURNS = -32004
TOO_MANY_CONNECTIONS = -32005
REQUEST_TOO_LARGE = -32006
PERMISSION_DENIED = -32007
SHUTTING_DOWN = -32008
PROVIDER_FAILED = -32009
HAS_CHILDREN = -32010
DURABILITY_FAILED = -32011
UNKNOWN_PROVIDER = -32012
AGENT_REFUSED = -32013
TOO_MANY_PENDING = -32014
OUTCOME_UNKNOWN = -32015

# Most specific first: the first isinstance match wins.
_EXCEPTION_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (errors.AgentNotFoundError, AGENT_NOT_FOUND),
    (errors.AgentBusyError, AGENT_BUSY),
    (errors.NameCollisionError, NAME_COLLISION),
    (errors.HasChildrenError, HAS_CHILDREN),
    (errors.AgentError, AGENT_REFUSED),
    (errors.UnknownProviderError, UNKNOWN_PROVIDER),
    (errors.ProviderError, PROVIDER_FAILED),
    (errors.OutcomeUnknownError, OUTCOME_UNKNOWN),
    (errors.DurabilityError, DURABILITY_FAILED),
    (errors.EntryTooLargeError, INVALID_PARAMS),
    (errors.BadInputError, INVALID_PARAMS),
    (errors.SubstratError, SUBSTRAT_ERROR),
    # Validation in the orchestrator (names, sizes, models) raises ValueError.
    (ValueError, INVALID_PARAMS),
)

RequestId = str | int | None


class RequestError(Exception):
    """Raised by a method handler to answer with a specific JSON-RPC error."""

    def __init__(self, code: int, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


def error_for_exception(
    exc: BaseException, *, agents: int | None = None
) -> tuple[int, str, dict[str, Any]]:
    """The (code, message, data) that reports ``exc`` to a client.

    An I/O failure gets one line of what fixes it (``oserrors.advice``; ``agents``
    sizes the descriptor budget). A plain OSError (a directory a read-only mount
    refuses, a log no descriptor is left to open) reaches here only from before
    an operation's commit point (after it, ``commit.after_commit`` makes it
    undecided), so the operation did not happen: ``-32011``, not a bug's ``-32603``.
    """
    if isinstance(exc, RequestError):
        return exc.code, exc.message, dict(exc.data or {})
    data: dict[str, Any] = {"type": type(exc).__name__}
    if isinstance(exc, errors.SubstratError):
        data.update(exc.details)
    message = str(exc) or type(exc).__name__
    for kind, code in _EXCEPTION_CODES:
        if isinstance(exc, kind):
            if code in (DURABILITY_FAILED, OUTCOME_UNKNOWN):
                message = _with_advice(message, exc, agents)
            if code == DURABILITY_FAILED and message.endswith(errors.REOPEN_NOTE):
                # the daemon reopens the log itself: the note is for a library caller
                message = message[: -len(errors.REOPEN_NOTE)] + errors.OPERATOR_NOTE
            return code, message, data
    if isinstance(exc, OSError) and exc.errno is not None:
        message = f"{message}; nothing of it was done"
        return DURABILITY_FAILED, _with_advice(message, exc, agents), data
    return INTERNAL_ERROR, f"internal error: {message}", data


def _with_advice(message: str, exc: BaseException, agents: int | None) -> str:
    hint = oserrors.advice(exc, agents=agents)
    if hint is None or hint in message:
        return message
    said = oserrors.advice(exc)  # said already (first, say) without the descriptor budget
    if said is not None and said in message:
        return message.replace(said, hint, 1)
    return f"{message}. {hint[0].upper()}{hint[1:]}"


# A NamedTuple, not a frozen dataclass: every CLI process and daemon defines it (see LockInfo)
class Request(NamedTuple):
    """One parsed call. ``is_notification`` means no response is wanted."""

    method: str
    params: dict[str, Any] | list[Any]
    id: RequestId = None
    is_notification: bool = False


Parsed = Request | dict[str, Any]
"""A request, or the error response its line earned."""


def encode(message: dict[str, Any] | list[dict[str, Any]]) -> bytes:
    """Serialise one message (or batch) to a line."""
    text = json.dumps(message, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.encode("utf-8") + b"\n"


def check_text(params: Any, outcome: str = "nothing was sent") -> None:
    """Refuse ``params`` if any text in them cannot be sent as UTF-8.

    Text read from a terminal, a file or argv that is not valid UTF-8 arrives
    with each bad byte as a lone surrogate (``surrogateescape``); JSON can carry
    one too (``"\\udcff"``). Neither can be logged, so the request is refused
    whole, before it is sent (the client) or run (the server). Raises
    :class:`errors.BadInputError` naming the field, the byte and its place,
    then ``outcome``.
    """
    if _all_utf8(params):
        return  # every turn's prompt and every request comes here: the walk that names
        # a field and a place (generators, a path text per value) only for a refusal
    for where, text in _texts(params, ""):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise errors.BadInputError(
                f"invalid UTF-8 in {where}: {_place(text, exc.start)}; {outcome} "
                "(convert it to UTF-8 first, e.g. with iconv)"
            ) from None


_FIELD_WORDS = {
    "prompt": "the prompt",
    "instructions": "the instructions",
    "name": "the name",
    "agent": "the agent name",
}


def _all_utf8(value: Any) -> bool:
    """True if every text in ``value`` (a JSON value) encodes as UTF-8; False when one
    does not, or for a kind :func:`_texts` must judge (a subclass of str, dict or list)."""
    kind = type(value)
    if kind is str:
        if value.isascii():
            return True
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True
    if kind is dict:
        return all(_all_utf8(key) and _all_utf8(item) for key, item in value.items())
    if kind is list:
        return all(_all_utf8(item) for item in value)
    return value is None or kind is int or kind is float or kind is bool


def _texts(value: Any, where: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        yield where or "the text", value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _texts(key, "a parameter name")
            yield from _texts(item, f"{where}.{key}" if where else _FIELD_WORDS.get(key, str(key)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _texts(item, f"{where or 'params'}[{index}]")


def _place(text: str, start: int) -> str:
    code = ord(text[start])
    # surrogateescape keeps an undecodable byte B as U+DC00+B (B >= 0x80)
    what = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"U+{code:04X}"
    line = text.count("\n", 0, start) + 1
    column = start - (text.rfind("\n", 0, start) + 1) + 1
    return f"{what} at line {line}, column {column}"


def response(request_id: RequestId, result: Any) -> dict[str, Any]:
    return {"jsonrpc": JSONRPC_VERSION, "id": request_id, "result": result}


def error_response(
    request_id: RequestId, code: int, message: str, data: Any = None
) -> dict[str, Any]:
    err: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        err["data"] = data
    return {"jsonrpc": JSONRPC_VERSION, "id": request_id, "error": err}


def notification(method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"jsonrpc": JSONRPC_VERSION, "method": method, "params": params or {}}


def request(method: str, params: dict[str, Any] | None, request_id: RequestId) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": JSONRPC_VERSION, "method": method}
    if params is not None:
        message["params"] = params
    message["id"] = request_id
    return message


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")


def loads(data: bytes) -> Any:
    """Strict JSON: UTF-8 only, no NaN/Infinity. Raises ValueError on anything else."""
    text = data.decode("utf-8")  # UnicodeDecodeError is a ValueError
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def parse_line(line: bytes) -> tuple[list[Parsed], bool]:
    """Parse one line into requests and/or error responses.

    Returns ``(items, is_batch)``. For a batch the responses must be sent back
    as one array (JSON-RPC 2.0 section 6); a batch of only notifications gets no
    response at all.
    """
    try:
        message = loads(line)
    except ValueError as exc:
        return [error_response(None, PARSE_ERROR, f"parse error: {_short(exc)}")], False
    escapes = b"\\ud" in line or b"\\uD" in line  # a scan of the line, not of every string
    if isinstance(message, list):
        if not message:
            return [error_response(None, INVALID_REQUEST, "empty batch")], False
        if len(message) > MAX_BATCH_ITEMS:
            return [
                error_response(
                    None,
                    INVALID_REQUEST,
                    f"batch of {len(message)} calls is over the limit of {MAX_BATCH_ITEMS}",
                )
            ], False
        return [parse_message(item, escapes=escapes) for item in message], True
    return [parse_message(message, escapes=escapes)], False


def parse_message(message: Any, *, escapes: bool = True) -> Parsed:
    """Validate one decoded request object.

    ``escapes=False`` says its line held no ``\\ud``/``\\uD`` escape: a strict UTF-8
    line can hold a lone surrogate no other way, so its text need not be checked.
    """
    if not isinstance(message, dict):
        return error_response(None, INVALID_REQUEST, "a request must be a JSON object")
    has_id = "id" in message
    raw_id = message.get("id")
    if has_id and not _valid_id(raw_id):
        return error_response(
            None, INVALID_REQUEST, "id must be a string, an integer or null (short)"
        )
    request_id: RequestId = raw_id if has_id else None
    if message.get("jsonrpc") != JSONRPC_VERSION:
        return error_response(request_id, INVALID_REQUEST, 'jsonrpc must be exactly "2.0"')
    method = message.get("method")
    if not isinstance(method, str) or not method or len(method) > MAX_METHOD_CHARS:
        return error_response(request_id, INVALID_REQUEST, "method must be a non-empty string")
    params = message.get("params", {})
    if not isinstance(params, (dict, list)):
        return error_response(
            request_id, INVALID_REQUEST, "params must be an object or an array when present"
        )
    try:  # a "\udcff" escape decodes to text that no log can hold
        if escapes:
            check_text(params, "the request was not run")
    except errors.BadInputError as exc:
        return error_response(request_id, INVALID_PARAMS, str(exc))
    return Request(method, params, request_id, is_notification=not has_id)


def _valid_id(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return abs(value) < 2**63
    if isinstance(value, float):
        return math.isfinite(value) and value.is_integer() and abs(value) < 2**53
    return isinstance(value, str) and len(value) <= MAX_ID_CHARS


def _short(exc: BaseException, limit: int = 200) -> str:
    text = str(exc)
    return text if len(text) <= limit else text[:limit] + "..."


class LineFramer:
    """Splits a byte stream into lines, with a hard limit on a line's length.

    ``feed`` yields complete lines (without the newline) and, for every line
    that went over ``max_line_bytes``, the sentinel ``None`` once: the
    oversized line is dropped as it streams in, never held in memory.
    """

    def __init__(self, max_line_bytes: int = MAX_REQUEST_BYTES) -> None:
        assert max_line_bytes > 0
        self.max_line_bytes = max_line_bytes
        self._buffer = bytearray()
        self._discarding = False

    def feed(self, data: bytes) -> Iterator[bytes | None]:
        start = 0
        while start < len(data):
            newline = data.find(b"\n", start)
            end = len(data) if newline < 0 else newline
            piece = data[start:end]
            if self._discarding:
                pass
            elif len(self._buffer) + len(piece) > self.max_line_bytes:
                self._buffer.clear()
                self._discarding = True
                yield None
            else:
                self._buffer += piece
            if newline < 0:
                return
            start = newline + 1
            if self._discarding:
                self._discarding = False
                continue
            line = bytes(self._buffer)
            self._buffer.clear()
            if line.strip():
                yield line

    @property
    def partial_bytes(self) -> int:
        """Bytes of an unfinished line held so far (for half-closed connections)."""
        return len(self._buffer)
