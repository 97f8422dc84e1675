"""A real chat-completions HTTP server on loopback, for tests.

It speaks enough of the OpenAI protocol for the official SDK: ``POST
/v1/chat/completions`` with and without ``stream``, text and tool-call answers
as server-sent events over chunked HTTP/1.1. Answers come from a script of
:class:`Reply` objects (or a responder function once the script runs out),
and a reply can instead be an injected failure: an HTTP error, a delay longer
than the client's timeout, a connection dropped before the headers or in the
middle of the stream, or a hang until the test releases it.

Like real endpoints it validates the conversation it is sent and answers 400
when an assistant tool call has no tool result (or a tool result answers no
call). The check is written here independently of substrat's own repair code
so that a shared bug cannot hide. Every request body is recorded.
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


@dataclass
class Reply:
    """One scripted answer, or one injected failure."""

    text: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    status: int = 200
    error: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0  # before the response headers: a timeout when > client timeout
    drop: str | None = None  # "before_headers" | "mid_stream"
    drop_after_chunks: int = 1
    hang: bool = False  # hold the request until release() or stop()
    stall_after_chunks: int | None = None  # stream that many events, then hang likewise
    keepalive_s: float = 0.0  # while stalled, send an SSE comment this often (as proxies do)
    garbled_chunk: int | None = None  # send this event's data as text that is not JSON
    chunk_chars: int = 5
    pieces: int | None = None  # instead: the text and each call's arguments in this many pieces
    finish: bool = True  # False: end the stream cleanly but without a finish reason


def text(body: str, **kwargs: Any) -> Reply:
    return Reply(text=body, **kwargs)


def tool_call(name: str, arguments: dict[str, Any] | str, call_id: str | None = None) -> dict:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"name": name, "arguments": args, "id": call_id}


def tools(*calls: dict[str, Any], say: str = "") -> Reply:
    return Reply(text=say, tool_calls=list(calls))


def error(status: int, message: str, code: str | None = None, **kwargs: Any) -> Reply:
    body = {"message": message, "type": "invalid_request_error", "code": code}
    return Reply(status=status, error=body, **kwargs)


def rate_limited(retry_after_s: float = 0.0) -> Reply:
    headers = {"retry-after": str(retry_after_s)}
    return error(429, "rate limit reached", "rate_limit", headers=headers)


def overflow() -> Reply:
    return error(
        400,
        "This model's maximum context length is 8192 tokens; your messages are longer.",
        "context_length_exceeded",
    )


@dataclass
class Recorded:
    """One request as the server saw it."""

    index: int
    path: str
    body: dict[str, Any]
    status: int = 0
    problem: str | None = None  # why it was rejected, when it was
    authorization: str | None = None  # the request's Authorization header

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages", []))


def conversation_problem(body: Any) -> str | None:
    """Why a request body is invalid, as an endpoint would see it; None if it is fine."""
    if not isinstance(body, dict) or not isinstance(body.get("model"), str):
        return "the body must be a JSON object with a string 'model'"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty array"
    open_ids: list[str] = []
    for position, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            return f"messages[{position}] has no valid role"
        role = message["role"]
        if role == "tool":
            call_id = message.get("tool_call_id")
            if call_id not in open_ids:
                return (
                    f"messages[{position}]: a 'tool' message must answer a tool call of the "
                    f"assistant message right before it; {call_id!r} does not"
                )
            open_ids.remove(call_id)
            continue
        if open_ids:
            return (
                "an assistant message with 'tool_calls' must be followed by tool messages "
                f"answering each call; no answer for {open_ids} (before messages[{position}])"
            )
        if role == "assistant":
            for call in message.get("tool_calls") or []:
                if not isinstance(call, dict) or not call.get("id"):
                    return f"messages[{position}]: every tool call needs an id"
                function = call.get("function") or {}
                if not isinstance(function.get("arguments"), str) or not function.get("name"):
                    return f"messages[{position}]: a tool call needs a name and string arguments"
                open_ids.append(call["id"])
    if open_ids:
        return f"the conversation ends with tool calls {open_ids} that have no answer"
    return None


def echo(body: dict[str, Any]) -> Reply:
    """The default responder: repeat the last user message."""
    users = [m for m in body.get("messages", []) if m.get("role") == "user"]
    last = users[-1].get("content", "") if users else ""
    return Reply(text=f"echo: {last}")


Responder = Callable[[dict[str, Any]], Reply]


class ChatServer:
    """Start with ``with ChatServer() as server:``; point the SDK at ``server.base_url``."""

    def __init__(
        self,
        responder: Responder = echo,
        *,
        max_context_chars: int | None = None,
        tls: ssl.SSLContext | None = None,  # serve https with this server context
    ):
        self.responder = responder
        self.tls = tls
        self.max_context_chars = max_context_chars
        self.requests: list[Recorded] = []
        self.on_request: Callable[[Recorded], None] | None = None
        self._script: list[Reply | Responder] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._released = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> ChatServer:
        server = self

        class Handler(_Handler):
            owner = server

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if self.tls is not None:
            self._httpd.socket = self.tls.wrap_socket(self._httpd.socket, server_side=True)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._released.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> ChatServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        assert self._httpd is not None, "start the server first"
        scheme = "http" if self.tls is None else "https"
        return f"{scheme}://127.0.0.1:{self._httpd.server_address[1]}/v1"

    # -- scripting ---------------------------------------------------------

    def script(self, *replies: Reply | Responder) -> None:
        """Queue answers for the next requests, in order (after any still queued)."""
        with self._lock:
            self._script.extend(replies)

    def release(self) -> None:
        """Let every hanging request go (they then drop their connection).

        Later hangs pass at once too, until :meth:`hold` re-arms them.
        """
        self._released.set()

    def hold(self) -> None:
        self._released.clear()

    @property
    def pending_script(self) -> int:
        with self._lock:
            return len(self._script)

    def accepted(self) -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests if r.status == 200]

    def rejected(self) -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests if r.problem is not None]

    # -- used by the handler -----------------------------------------------

    def _record(self, path: str, body: Any, authorization: str | None = None) -> Recorded:
        with self._lock:
            record = Recorded(len(self.requests), path, body if isinstance(body, dict) else {})
            record.authorization = authorization
            self.requests.append(record)
            return record

    def _next_reply(self, body: dict[str, Any]) -> Reply:
        with self._lock:
            item = self._script.pop(0) if self._script else self.responder
        return item if isinstance(item, Reply) else item(body)

    def _too_long(self, body: dict[str, Any]) -> bool:
        if self.max_context_chars is None:
            return False
        size = sum(len(json.dumps(m)) for m in body.get("messages", []))
        return size > self.max_context_chars

    def _wait(self, seconds: float) -> bool:
        """Sleep, but wake when the server stops; True if it is stopping."""
        return self._stopping.wait(seconds)


class _Handler(BaseHTTPRequestHandler):
    owner: ChatServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
        return

    def do_POST(self) -> None:
        owner = self.owner
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length)
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = None
        record = owner._record(self.path, body, self.headers.get("authorization"))
        if not self.path.rstrip("/").endswith("/chat/completions"):
            return self._fail(record, 404, f"no route {self.path}", "not_found")
        problem = conversation_problem(body)
        if problem is not None:
            return self._fail(record, 400, problem, "invalid_request_body")
        if owner._too_long(body):
            message = "This model's maximum context length was exceeded by your messages."
            return self._fail(record, 400, message, "context_length_exceeded")
        if owner.on_request is not None:
            owner.on_request(record)
        reply = owner._next_reply(body)
        if reply.delay_s and owner._wait(reply.delay_s):
            return
        if reply.hang:
            owner._released.wait()
            return self._drop(record)
        if reply.drop == "before_headers":
            return self._drop(record)
        if reply.status != 200:
            record.status = reply.status
            return self._json(reply.status, {"error": reply.error or {}}, reply.headers)
        record.status = 200
        if body.get("stream"):
            self._stream(body, reply, record)
        else:
            self._json(200, _completion(body, reply), reply.headers)

    def _fail(self, record: Recorded, status: int, message: str, code: str) -> None:
        record.status, record.problem = status, message
        error_body = {"message": message, "type": "invalid_request_error", "code": code}
        self._json(status, {"error": error_body}, {})

    def _drop(self, record: Recorded) -> None:
        record.status = -1
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _json(self, status: int, payload: dict[str, Any], headers: dict[str, str]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.send_header("connection", "close")
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)
        self.close_connection = True

    def _stream(self, body: dict[str, Any], reply: Reply, record: Recorded) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.send_header("connection", "close")
        self.end_headers()
        self.close_connection = True
        sent = 0
        try:
            for event in _events(body, reply):
                if reply.stall_after_chunks is not None and sent >= reply.stall_after_chunks:
                    self.wfile.flush()
                    while not self.owner._released.wait(reply.keepalive_s or None):
                        comment = b": keep-alive\n\n"
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(comment), comment))
                        self.wfile.flush()
                    record.status = -1
                    self._drop(record)
                    return
                if reply.drop == "mid_stream" and sent >= reply.drop_after_chunks:
                    record.status = -1
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)  # no terminating chunk
                    return
                data = f"data: {json.dumps(event)}\n\n".encode()
                if sent == reply.garbled_chunk:
                    data = b"data: {this is not json\n\n"
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                sent += 1
            done = b"data: [DONE]\n\n"
            self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
        except (BrokenPipeError, ConnectionResetError):
            return  # the client went away; that is its business


def _chunk(body: dict[str, Any], delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-loopback",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": body.get("model", ""),
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def _call_ids(body: dict[str, Any], reply: Reply) -> list[str]:
    taken = len(body.get("messages", []))
    return [c.get("id") or f"call_{taken}_{i}" for i, c in enumerate(reply.tool_calls)]


def _step(reply: Reply, whole: str) -> int:
    """Characters per streamed piece of ``whole`` (the text, or one call's arguments)."""
    if reply.pieces is not None:
        return max(1, -(-len(whole) // reply.pieces))
    return max(1, reply.chunk_chars)


def _events(body: dict[str, Any], reply: Reply) -> list[dict[str, Any]]:
    out = [_chunk(body, {"role": "assistant", "content": ""}, None)]
    step = _step(reply, reply.text)
    for start in range(0, len(reply.text), step):
        out.append(_chunk(body, {"content": reply.text[start : start + step]}, None))
    ids = _call_ids(body, reply)
    for index, (call, call_id) in enumerate(zip(reply.tool_calls, ids, strict=True)):
        head = {"index": index, "id": call_id, "type": "function"}
        head["function"] = {"name": call["name"], "arguments": ""}
        out.append(_chunk(body, {"tool_calls": [head]}, None))
        args = call["arguments"]
        step = _step(reply, args)
        for start in range(0, len(args), step):
            piece = {"index": index, "function": {"arguments": args[start : start + step]}}
            out.append(_chunk(body, {"tool_calls": [piece]}, None))
    if reply.finish:
        out.append(_chunk(body, {}, "tool_calls" if reply.tool_calls else "stop"))
    return out


def _completion(body: dict[str, Any], reply: Reply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
    if reply.tool_calls:
        ids = _call_ids(body, reply)
        message["tool_calls"] = [
            {
                "id": cid,
                "type": "function",
                "function": {"name": c["name"], "arguments": c["arguments"]},
            }
            for c, cid in zip(reply.tool_calls, ids, strict=True)
        ]
    return {
        "id": "chatcmpl-loopback",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", ""),
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if reply.tool_calls else "stop",
            }
        ],
    }
