"""The JSON-RPC server: connections, limits, dispatch, notifications.

Knows nothing of agents: it serves a :class:`MethodTable`. The daemon builds
the table (``substrat.rpc.methods``) and hands the server to asyncio's Unix
server.

Guarantees a client can rely on:

* every request with an ``id`` gets exactly one response, also when the input
  was malformed, too large, or over a limit (then it is a JSON-RPC error);
* a response is written only after the handler returned, so a success answer
  means the operation is durable (the orchestrator fsyncs before returning);
* a client that goes away does not cancel its requests: a turn in progress
  runs to completion and is logged; only the answer is dropped;
* nothing a client sends can stop the server: a handler's unexpected exception
  becomes an ``internal error`` response and is logged with its traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from substrat.eventlog import utc_now_iso
from substrat.rpc import protocol
from substrat.rpc.protocol import Request, RequestError
from substrat.rpc.transport import peer_credentials

log = logging.getLogger("substrat.daemon")

READ_CHUNK_BYTES = 64 << 10


@dataclass(frozen=True)
class Limits:
    """Explicit limits; going over one is answered with a JSON-RPC error."""

    max_request_bytes: int = protocol.MAX_REQUEST_BYTES
    max_connections: int = 64
    max_concurrent_turns: int = 8
    max_pending_per_connection: int = 32
    max_queued_notifications: int = 4096

    def to_dict(self) -> dict[str, int]:
        return {
            "max_request_bytes": self.max_request_bytes,
            "max_connections": self.max_connections,
            "max_concurrent_turns": self.max_concurrent_turns,
            "max_pending_per_connection": self.max_pending_per_connection,
            "max_queued_notifications": self.max_queued_notifications,
        }


# A NamedTuple, not a frozen dataclass: every daemon defines it (see rpc.lock.LockInfo)
class Param(NamedTuple):
    """One named parameter: accepted types, whether required, a length bound for strings."""

    name: str
    types: tuple[type, ...]
    required: bool = True
    default: Any = None
    max_chars: int | None = None


@dataclass
class Call:
    """What a handler gets: its bound params and a way to talk to its connection."""

    connection: Connection
    request_id: protocol.RequestId
    params: dict[str, Any]

    def notify(self, method: str, params: dict[str, Any]) -> None:
        self.connection.notify(method, params)


Handler = Callable[[Call], Awaitable[Any]]


@dataclass(frozen=True)
class Method:
    name: str
    handler: Handler
    params: tuple[Param, ...] = ()
    is_turn: bool = False
    """Counts against ``Limits.max_concurrent_turns`` while it runs."""
    while_stopping: bool = False
    """Still served while the daemon shuts down (ping, status)."""


class MethodTable:
    def __init__(self, methods: Iterable[Method] = ()) -> None:
        self._methods: dict[str, Method] = {}
        for method in methods:
            self.add(method)

    def add(self, method: Method) -> None:
        assert method.name not in self._methods, f"duplicate method {method.name}"
        self._methods[method.name] = method

    def get(self, name: str) -> Method | None:
        return self._methods.get(name)

    def names(self) -> list[str]:
        return sorted(self._methods)


def bind_params(method: Method, params: dict[str, Any] | list[Any]) -> dict[str, Any]:
    """Check ``params`` against the method's declaration; RequestError if they do not fit."""
    spec = method.params
    if isinstance(params, list):
        if len(params) > len(spec):
            raise _invalid(f"{method.name} takes at most {len(spec)} parameters")
        named = {p.name: value for p, value in zip(spec, params, strict=False)}
    else:
        unknown = sorted(set(params) - {p.name for p in spec})
        if unknown:
            raise _invalid(f"{method.name}: unknown parameter(s) {', '.join(unknown)}")
        named = dict(params)
    bound: dict[str, Any] = {}
    for p in spec:
        if p.name not in named:
            if p.required:
                raise _invalid(f"{method.name}: missing required parameter {p.name!r}")
            bound[p.name] = p.default
            continue
        value = named[p.name]
        if value is None and not p.required:
            bound[p.name] = p.default
            continue
        if isinstance(value, bool) and bool not in p.types:
            raise _invalid(f"{method.name}: {p.name} must be {_type_names(p.types)}")
        if not isinstance(value, p.types):
            raise _invalid(f"{method.name}: {p.name} must be {_type_names(p.types)}")
        if p.max_chars is not None and isinstance(value, str) and len(value) > p.max_chars:
            raise _invalid(f"{method.name}: {p.name} is longer than {p.max_chars} characters")
        bound[p.name] = value
    return bound


def _invalid(message: str) -> RequestError:
    return RequestError(protocol.INVALID_PARAMS, message)


def _type_names(types: tuple[type, ...]) -> str:
    names = {str: "a string", int: "an integer", bool: "a boolean", list: "an array"}
    names[dict] = "an object"
    return " or ".join(names.get(t, t.__name__) for t in types)


@dataclass(eq=False)
class Connection:
    """One client connection: its outbox, subscription and in-flight requests."""

    id: int
    writer: asyncio.StreamWriter
    limits: Limits
    peer_pid: int = 0
    peer_uid: int = -1
    subscription: frozenset[str] | None = None
    """Event names this connection wants (empty = all); None = not subscribed."""
    pending: int = 0
    dropped_notifications: int = 0
    closed: bool = False
    writer_task: asyncio.Task[None] | None = None
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    """Set while no request of this connection is in progress."""
    _outbox: asyncio.Queue[tuple[bytes, bool] | None] = field(default_factory=asyncio.Queue)
    _queued_notifications: int = 0

    def send(self, message: dict[str, Any] | list[dict[str, Any]]) -> None:
        """Queue a response; responses are never dropped while the peer is there."""
        if not self.closed:
            self._outbox.put_nowait((protocol.encode(message), False))

    def notify(self, method: str, params: dict[str, Any]) -> None:
        """Queue a notification; dropped (and counted) if the client does not keep up."""
        if self.closed:
            return
        if self._queued_notifications >= self.limits.max_queued_notifications:
            self.dropped_notifications += 1
            return
        if self.dropped_notifications:
            lost, self.dropped_notifications = self.dropped_notifications, 0
            self._queue_notification("events.dropped", {"count": lost})
        self._queue_notification(method, params)

    def _queue_notification(self, method: str, params: dict[str, Any]) -> None:
        self._queued_notifications += 1
        self._outbox.put_nowait((protocol.encode(protocol.notification(method, params)), True))

    def wants(self, event: str) -> bool:
        sub = self.subscription
        return sub is not None and (not sub or event in sub)

    async def write_loop(self) -> None:
        while True:
            item = await self._outbox.get()
            if item is None:
                break
            data, is_notification = item
            if is_notification:
                self._queued_notifications -= 1
            if self.closed:
                continue
            try:
                self.writer.write(data)
                await self.writer.drain()
            except (ConnectionError, OSError, RuntimeError):
                self.closed = True

    def finish(self) -> None:
        """Let the write loop flush what is queued, then stop."""
        self._outbox.put_nowait(None)


class RpcServer:
    """Serves one :class:`MethodTable` to many connections under :class:`Limits`."""

    def __init__(
        self,
        methods: MethodTable,
        *,
        limits: Limits | None = None,
        allowed_uid: int | None = None,
        grace_s: float | None = None,
    ) -> None:
        self.methods = methods
        self.grace_s = grace_s
        """How long a stop waits for running requests (the daemon's ``--grace-s``)."""
        self.limits = limits or Limits()
        self.allowed_uid = os.getuid() if allowed_uid is None else allowed_uid
        self.connections: set[Connection] = set()
        self.active_turns = 0
        self._turn_ended = asyncio.Event()
        """Set (and replaced) when a turn ends: a turn waiting for a slot (``wait``) looks again."""
        self.stopping = False
        self.refused_connections = 0
        self.agent_count: Callable[[], int] | None = None
        """How many agents the daemon serves (for the descriptor budget in advice)."""
        self.last_io_error: dict[str, Any] | None = None
        """The last request an I/O failure answered (``daemon status`` shows it)."""
        self.before_answer: Callable[[], None] | None = None
        """Run before each answer is sent (the daemon's root check, substrat.rootguard)."""
        self._ids = itertools.count(1)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._handlers: set[asyncio.Task[Any]] = set()

    # -- events --------------------------------------------------------------

    def publish(self, event: str, params: dict[str, Any]) -> int:
        """Send an event notification to every subscriber that wants it."""
        sent = 0
        for conn in list(self.connections):
            if conn.wants(event):
                conn.notify(event, params)
                sent += 1
        return sent

    @property
    def subscribers(self) -> int:
        return sum(1 for c in self.connections if c.subscription is not None)

    # -- connections ---------------------------------------------------------

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """asyncio's per-connection callback."""
        conn = Connection(next(self._ids), writer, self.limits)
        current = asyncio.current_task()
        if current is not None:
            self._handlers.add(current)
            current.add_done_callback(self._handlers.discard)
        writer_task = conn.writer_task = asyncio.create_task(conn.write_loop())
        try:
            refusal = self._refusal(conn)
            if refusal is not None:
                self.refused_connections += 1
                code, message = refusal
                conn.send(protocol.error_response(None, code, message))
                log.warning("refused connection %d: %s", conn.id, message)
                return
            self.connections.add(conn)
            await self._read_loop(conn, reader)
            await self._wait_pending(conn)
        except Exception:  # one connection must never take the daemon down
            log.exception("connection %d failed", conn.id)
        finally:
            self.connections.discard(conn)
            conn.subscription = None
            conn.finish()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer_task, timeout=5.0)
            conn.closed = True
            writer_task.cancel()
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _refusal(self, conn: Connection) -> tuple[int, str] | None:
        sock = conn.writer.get_extra_info("socket")
        try:
            conn.peer_pid, conn.peer_uid, _gid = peer_credentials(sock)
        except (OSError, AttributeError, TypeError):
            return protocol.PERMISSION_DENIED, "cannot read the peer's credentials; refused"
        if conn.peer_uid != self.allowed_uid:
            return (
                protocol.PERMISSION_DENIED,
                f"permission denied: this daemon serves uid {self.allowed_uid} only "
                f"(connection from uid {conn.peer_uid})",
            )
        if len(self.connections) >= self.limits.max_connections:
            return (
                protocol.TOO_MANY_CONNECTIONS,
                f"too many connections (limit {self.limits.max_connections}); "
                "close idle clients and retry",
            )
        return None

    async def _read_loop(self, conn: Connection, reader: asyncio.StreamReader) -> None:
        framer = protocol.LineFramer(self.limits.max_request_bytes)
        while not conn.closed:
            try:
                data = await reader.read(READ_CHUNK_BYTES)
            except (ConnectionError, OSError):
                conn.closed = True
                return
            if not data:
                # Half-closed: a final request without a newline still counts.
                if framer.partial_bytes:
                    for line in framer.feed(b"\n"):
                        self._on_line(conn, line)
                return
            for line in framer.feed(data):
                self._on_line(conn, line)

    def _on_line(self, conn: Connection, line: bytes | None) -> None:
        if line is None:
            conn.send(
                protocol.error_response(
                    None,
                    protocol.REQUEST_TOO_LARGE,
                    f"request line over the limit of {self.limits.max_request_bytes} bytes; "
                    "it was discarded",
                )
            )
            return
        items, is_batch = protocol.parse_line(line)
        if conn.pending >= self.limits.max_pending_per_connection:
            errors = [
                protocol.error_response(
                    item.id if isinstance(item, Request) else None,
                    protocol.TOO_MANY_PENDING,
                    f"over {self.limits.max_pending_per_connection} unanswered requests on "
                    "this connection; wait for answers before sending more",
                )
                for item in items
                if not (isinstance(item, Request) and item.is_notification)
            ]
            if errors:
                conn.send(errors if is_batch else errors[0])
            return
        conn.pending += 1
        conn.idle.clear()
        task = asyncio.create_task(self._serve_items(conn, items, is_batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve_items(self, conn: Connection, items: list[Any], is_batch: bool) -> None:
        try:
            answers: list[dict[str, Any]] = []
            for item in items:
                if not isinstance(item, Request):
                    answers.append(item)
                    continue
                answer = await self._dispatch(conn, item)
                if answer is not None:
                    answers.append(answer)
            if answers:
                if self.before_answer is not None:
                    self.before_answer()
                conn.send(answers if is_batch else answers[0])
        finally:
            conn.pending -= 1
            if conn.pending == 0:
                conn.idle.set()

    async def _dispatch(self, conn: Connection, req: Request) -> dict[str, Any] | None:
        method = self.methods.get(req.method)
        try:
            if method is None:
                raise RequestError(
                    protocol.METHOD_NOT_FOUND,
                    f"no method {req.method!r}; `rpc.methods` lists the available ones",
                )
            if self.stopping and not method.while_stopping:
                raise RequestError(
                    protocol.SHUTTING_DOWN,
                    "the daemon is shutting down; retry after restart",
                    self.not_applied(),
                )
            params = bind_params(method, req.params)
            call = Call(conn, req.id, params)
            if method.is_turn:
                result = await self._run_turn(method, call)
            else:
                result = await method.handler(call)
        except asyncio.CancelledError:
            if req.is_notification:
                raise
            conn.send(
                protocol.error_response(
                    req.id, protocol.SHUTTING_DOWN, "the daemon stopped before this finished"
                )
            )
            raise
        except Exception as exc:
            agents = self.agent_count() if self.agent_count is not None else None
            code, message, data = protocol.error_for_exception(exc, agents=agents)
            if code == protocol.INTERNAL_ERROR:
                log.exception("method %s failed", req.method)
            elif code in (protocol.DURABILITY_FAILED, protocol.OUTCOME_UNKNOWN):
                # the host's trouble (a full disk, a read-only remount, a limit): one line
                # an operator can grep, and the last one in `daemon status`
                log.error("%s failed (%d): %s", req.method, code, message)
                self.last_io_error = {
                    "method": req.method,
                    "code": code,
                    "message": message,
                    "time": utc_now_iso(),
                }
            return (
                None
                if req.is_notification
                else protocol.error_response(req.id, code, message, data or None)
            )
        return None if req.is_notification else protocol.response(req.id, result)

    async def _run_turn(self, method: Method, call: Call) -> Any:
        limit = self.limits.max_concurrent_turns
        said = False
        while self.active_turns >= limit:
            if not call.params.get("wait"):
                raise RequestError(
                    protocol.TOO_MANY_TURNS,
                    f"{self.active_turns} turns are running, the limit is {limit}; retry when "
                    "one finishes",
                )
            if self.stopping:  # a turn that ends while the daemon stops frees no slot
                raise RequestError(
                    protocol.SHUTTING_DOWN,
                    "the daemon stopped before this turn could start",
                    self.not_applied(),
                )
            if not said and call.params.get("progress"):
                said = True
                call.notify(
                    "turn.status",
                    {"request_id": call.request_id, "status": "queued", "limit": limit},
                )
            await self._turn_ended.wait()  # --wait: as for a busy agent, the client's bound
        self.active_turns += 1
        try:
            return await method.handler(call)
        finally:
            self.active_turns -= 1
            self._turn_ended.set()
            self._turn_ended = asyncio.Event()

    # -- shutdown ------------------------------------------------------------

    def not_applied(self) -> dict[str, Any]:
        """The data of a refusal made before the request ran (the daemon is stopping): a
        client may send it again to the next daemon (``substrat.client``); a request cut
        short by the stop (its ``-32008`` has no ``applied``) may have been applied."""
        return {"applied": False, "stopping": True, "pid": os.getpid(), "grace_s": self.grace_s}

    async def drain(self, grace_s: float) -> int:
        """Stop taking work; wait up to ``grace_s`` for requests in progress.

        Returns how many were still running at the deadline (they are then
        cancelled; their clients get a ``shutting down`` error).
        """
        self.stopping = True
        self._turn_ended.set()  # turns waiting for a slot are refused, not left to the grace
        pending = {t for t in self._tasks if not t.done()}
        if pending:
            _done, pending = await asyncio.wait(pending, timeout=grace_s)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=5.0)
        return len(pending)

    async def close_connections(self, farewell: dict[str, Any] | None = None) -> None:
        """Say goodbye to every client (``daemon.stopping``), flush, and hang up."""
        for conn in list(self.connections):
            if farewell is not None:
                conn.notify("daemon.stopping", farewell)
            conn.finish()
        writers = [c.writer_task for c in self.connections if c.writer_task is not None]
        if writers:
            await asyncio.wait(writers, timeout=2.0)
        for conn in list(self.connections):
            with contextlib.suppress(Exception):
                conn.writer.close()
        handlers = [t for t in self._handlers if t is not asyncio.current_task()]
        if handlers:
            _done, stuck = await asyncio.wait(handlers, timeout=5.0)
            for task in stuck:
                task.cancel()

    async def _wait_pending(self, conn: Connection) -> None:
        """After the client's EOF: answer what it already asked, then close."""
        if conn.pending and not conn.closed:
            await conn.idle.wait()
