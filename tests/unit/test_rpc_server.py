"""The RPC server's limits and failure handling, in-process over a real Unix socket."""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from substrat.rpc import protocol
from substrat.rpc.server import Call, Limits, Method, MethodTable, Param, RpcServer
from substrat.rpc.transport import bind_private

Json = dict[str, Any]


class Gate:
    """A method that blocks until released; counts how many calls finished."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started = 0
        self.finished = 0

    async def __call__(self, call: Call) -> str:
        self.started += 1
        await self.release.wait()
        self.finished += 1
        return "done"


def _table(gate: Gate) -> MethodTable:
    async def echo(call: Call) -> Any:
        return call.params["value"]

    async def boom(call: Call) -> None:
        raise RuntimeError("kaboom")

    async def subscribe(call: Call) -> bool:
        call.connection.subscription = frozenset()
        return True

    return MethodTable(
        [
            Method("echo", echo, (Param("value", (str, int)),)),
            Method("boom", boom),
            Method("slow", gate),
            Method("turn", gate, is_turn=True),
            Method("subscribe", subscribe),
            Method("ping", echo, (Param("value", (str, int), False, "pong"),), while_stopping=True),
        ]
    )


class Peer:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.ids = 0

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def call(self, method: str, params: Json | None = None) -> Json:
        self.ids += 1
        await self.send(protocol.encode(protocol.request(method, params, self.ids)))
        return await self.read()

    async def read(self, timeout_s: float = 5.0) -> Any:
        line = await asyncio.wait_for(self.reader.readline(), timeout_s)
        assert line, "connection closed"
        return json.loads(line)

    async def closed(self, timeout_s: float = 5.0) -> bool:
        return await asyncio.wait_for(self.reader.read(), timeout_s) == b""


Scenario = Callable[[RpcServer, Callable[[], Awaitable[Peer]], Gate], Awaitable[None]]


async def _serve(tmp_path: Path, limits: Limits, scenario: Scenario, **kw: Any) -> None:
    gate = Gate()
    server = RpcServer(_table(gate), limits=limits, **kw)
    path = tmp_path / "t.sock"
    listener = await asyncio.start_unix_server(server.handle, sock=bind_private(path))
    peers: list[Peer] = []

    async def connect() -> Peer:
        reader, writer = await asyncio.open_unix_connection(str(path))
        peers.append(Peer(reader, writer))
        return peers[-1]

    try:
        await scenario(server, connect, gate)
    finally:
        gate.release.set()
        for peer in peers:
            peer.writer.close()
        listener.close()
        await server.close_connections()


def run(tmp_path: Path, scenario: Scenario, limits: Limits | None = None, **kw: Any) -> None:
    asyncio.run(_serve(tmp_path, limits or Limits(), scenario, **kw))


def _code(message: Json) -> int:
    return int(message["error"]["code"])


def test_calls_errors_and_unknown_methods(tmp_path: Path) -> None:
    async def scenario(server: RpcServer, connect: Any, gate: Gate) -> None:
        peer = await connect()
        assert (await peer.call("echo", {"value": "hi"}))["result"] == "hi"
        assert _code(await peer.call("nope")) == protocol.METHOD_NOT_FOUND
        assert _code(await peer.call("echo", {"value": [1]})) == protocol.INVALID_PARAMS
        crash = await peer.call("boom")
        assert _code(crash) == protocol.INTERNAL_ERROR
        assert "kaboom" in crash["error"]["message"]
        assert (await peer.call("echo", {"value": 2}))["result"] == 2  # still serving

    run(tmp_path, scenario)


def test_socket_is_private(tmp_path: Path) -> None:
    async def scenario(server: RpcServer, connect: Any, gate: Gate) -> None:
        assert os.stat(tmp_path / "t.sock").st_mode & 0o777 == 0o600

    run(tmp_path, scenario)


def test_batch_answers_in_one_array_without_notifications(tmp_path: Path) -> None:
    async def scenario(server: RpcServer, connect: Any, gate: Gate) -> None:
        peer = await connect()
        batch = [
            protocol.request("echo", {"value": 1}, 1),
            {"jsonrpc": "2.0", "method": "echo", "params": {"value": 2}},
            protocol.request("nope", None, 2),
            7,
        ]
        await peer.send(json.dumps(batch).encode() + b"\n")
        answer = await peer.read()
        assert isinstance(answer, list) and len(answer) == 3
        assert answer[0] == {"jsonrpc": "2.0", "id": 1, "result": 1}
        assert _code(answer[1]) == protocol.METHOD_NOT_FOUND
        assert _code(answer[2]) == protocol.INVALID_REQUEST

    run(tmp_path, scenario)


def test_oversized_request_is_refused_and_the_connection_goes_on(tmp_path: Path) -> None:
    async def scenario(server: RpcServer, connect: Any, gate: Gate) -> None:
        peer = await connect()
        big = protocol.encode(protocol.request("echo", {"value": "x" * 5000}, 1))
        await peer.send(big)
        assert _code(await peer.read()) == protocol.REQUEST_TOO_LARGE
        assert (await peer.call("echo", {"value": "ok"}))["result"] == "ok"

    run(tmp_path, scenario, Limits(max_request_bytes=1000))


def test_connection_limit(tmp_path: Path) -> None:
    async def scenario(server: RpcServer, connect: Any, gate: Gate) -> None:
        first, second = await connect(), await connect()
        assert (await first.call("echo", {"value": 1}))["result"] == 1
        assert (await second.call("echo", {"value": 2}))["result"] == 2
        third = await connect()
        refusal = await third.read()
        assert _code(refusal) == protocol.TOO_MANY_CONNECTIONS
        assert await third.closed()
        assert server.refused_connections == 1

    run(tmp_path, scenario, Limits(max_connections=2))


def test_concurrent_turn_limit(tmp_path: Path) -> None:
    async def scenario(server: RpcServer, connect: Any, gate: Gate) -> None:
        a, b = await connect(), await connect()
        await a.send(protocol.encode(protocol.request("turn", None, 1)))
        while gate.started < 1:
            await asyncio.sleep(0.01)
        assert _code(await b.call("turn")) == protocol.TOO_MANY_TURNS
        gate.release.set()
        assert (await a.read())["result"] == "done"
        assert server.active_turns == 0

    run(tmp_path, scenario, Limits(max_concurrent_turns=1))


def test_pending_requests_per_connection_limit(tmp_path: Path) -> None:
    async def scenario(server: RpcServer, connect: Any, gate: Gate) -> None:
        peer = await connect()
        for i in (1, 2, 3):
            await peer.send(protocol.encode(protocol.request("slow", None, i)))
        refusal = await peer.read()
        assert refusal["id"] == 3 and _code(refusal) == protocol.TOO_MANY_PENDING
        gate.release.set()
        assert {(await peer.read())["id"], (await peer.read())["id"]} == {1, 2}

    run(tmp_path, scenario, Limits(max_pending_per_connection=2))


def test_half_closed_connection_still_gets_its_answer(tmp_path: Path) -> None:
    async def scenario(server: RpcServer, connect: Any, gate: Gate) -> None:
        peer = await connect()
        line = protocol.encode(protocol.request("echo", {"value": "last"}, 9))
        await peer.send(line[:-1])  # no newline: the end of the stream ends the line
        peer.writer.write_eof()
        assert (await peer.read())["result"] == "last"
        assert await peer.closed()

    run(tmp_path, scenario)


def test_client_leaving_does_not_cancel_its_request(tmp_path: Path) -> None:
    async def scenario(server: RpcServer, connect: Any, gate: Gate) -> None:
        peer = await connect()
        await peer.send(protocol.encode(protocol.request("slow", None, 1)))
        while gate.started < 1:
            await asyncio.sleep(0.01)
        peer.writer.transport.abort()
        await asyncio.sleep(0.05)
        gate.release.set()
        for _ in range(100):
            if gate.finished:
                break
            await asyncio.sleep(0.01)
        assert gate.finished == 1

    run(tmp_path, scenario)


def test_other_uid_is_refused(tmp_path: Path) -> None:
    async def scenario(server: RpcServer, connect: Any, gate: Gate) -> None:
        peer = await connect()
        refusal = await peer.read()
        assert _code(refusal) == protocol.PERMISSION_DENIED
        assert f"uid {os.getuid()}" in refusal["error"]["message"]
        assert await peer.closed()

    run(tmp_path, scenario, allowed_uid=os.getuid() + 12345)


def test_stopping_server_refuses_work_but_answers_ping(tmp_path: Path) -> None:
    async def scenario(server: RpcServer, connect: Any, gate: Gate) -> None:
        peer = await connect()
        server.stopping = True
        refusal = await peer.call("echo", {"value": 1})
        assert _code(refusal) == protocol.SHUTTING_DOWN
        # never run: a client may send it to the next daemon (substrat.rpc.starting)
        assert refusal["error"]["data"]["applied"] is False
        assert refusal["error"]["data"]["pid"] == os.getpid()
        assert (await peer.call("ping"))["result"] == "pong"

    run(tmp_path, scenario)


def test_slow_subscriber_loses_notifications_and_is_told_how_many(tmp_path: Path) -> None:
    async def scenario(server: RpcServer, connect: Any, gate: Gate) -> None:
        peer = await connect()
        assert (await peer.call("subscribe"))["result"] is True
        for i in range(50):  # no await: the writer cannot drain in between
            server.publish("tick", {"i": i})
        got = [await peer.read() for _ in range(10)]
        assert [m["params"]["i"] for m in got] == list(range(10))
        server.publish("tick", {"i": 99})
        dropped = await peer.read()
        assert dropped["method"] == "events.dropped" and dropped["params"]["count"] == 40
        assert (await peer.read())["params"]["i"] == 99

    run(tmp_path, scenario, Limits(max_queued_notifications=10))


def test_peer_credentials_are_read_from_the_socket(tmp_path: Path) -> None:
    from substrat.rpc.transport import peer_credentials

    left, right = socket.socketpair(socket.AF_UNIX)
    try:
        pid, uid, _gid = peer_credentials(left)
        assert (pid, uid) == (os.getpid(), os.getuid())
    finally:
        left.close()
        right.close()
