"""Fuzzing the real daemon's socket: it answers every request and never dies.

One daemon process serves the whole module. Each Hypothesis example opens a
connection and sends a mix of garbage bytes, malformed JSON, wrong parameter
types and unknown methods, sometimes half-closing or dropping the connection.
After each example the daemon must still answer ``ping`` (same pid), and the
connection must have received exactly one response per line that earns one
(JSON-RPC: one per request with an id, one array per batch, one error per
unparseable line).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from substrat.client import Client, DaemonProcess
from substrat.rpc import protocol
from substrat.rpc.protocol import Request
from substrat.rpc.transport import connect, socket_path

METHODS = [
    "ping",
    "daemon.status",
    "rpc.methods",
    "agent.create",
    "agent.send",
    "agent.list",
    "agent.tree",
    "agent.show",
    "agent.history",
    "agent.terminate",
    "inbox.list",
    "inbox.ack",
    "inbox.collect",
    "events.subscribe",
    "events.unsubscribe",
]  # daemon.shutdown is left out on purpose: it would (correctly) stop the daemon
READ_TIMEOUT_S = 15.0


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    root = tmp_path_factory.mktemp("fuzz") / "root"
    process = DaemonProcess(root).start(timeout_s=30)
    with Client(root) as client:  # something for the methods to find
        client.call("agent.create", {"name": "target"})
    yield process
    process.kill()


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)
names = st.sampled_from(["target", "nobody", "", "a/b", "x" * 70, "fuzz-1", "user"])
params = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {},
        optional={
            "agent": names | json_values,
            "name": names | json_values,
            "prompt": st.text(max_size=50) | json_values,
            "stream": st.booleans() | json_values,
            "cascade": st.booleans(),
            "limit": st.integers(min_value=-5, max_value=20_000) | json_values,
            "message_ids": st.lists(st.text(max_size=5), max_size=3) | json_values,
            "events": st.lists(st.sampled_from(["turn.completed", "bogus"]), max_size=2),
            "provider": st.sampled_from(["scripted", "paced", "nope"]) | json_values,
            "model": st.sampled_from([None, "5ms", "bad"]),
        },
    ),
)
methods = st.sampled_from(METHODS) | st.text(max_size=20)
requests = st.builds(
    lambda m, p, i, with_id: {
        "jsonrpc": "2.0",
        "method": m,
        "params": p,
        **({"id": i} if with_id else {}),
    },
    methods,
    params,
    st.integers(min_value=0, max_value=10**6) | st.text(max_size=8),
    st.booleans(),
)
broken = st.dictionaries(
    st.sampled_from(["jsonrpc", "method", "params", "id"]), json_values, max_size=4
)
lines = st.one_of(
    requests.map(lambda r: json.dumps(r).encode()),
    broken.map(lambda r: json.dumps(r).encode()),
    st.lists(requests | broken | json_values, min_size=0, max_size=5).map(
        lambda b: json.dumps(b).encode()
    ),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=80).map(lambda b: b.replace(b"\n", b" ")),
)
endings = st.sampled_from(["keep", "half_close", "drop"])


def expected_answers(line: bytes) -> int:
    """How many responses the daemon owes for one line (see the module docstring)."""
    if not line.strip():
        return 0
    items, is_batch = protocol.parse_line(line)
    owed = [i for i in items if not (isinstance(i, Request) and i.is_notification)]
    if is_batch:
        return 1 if owed else 0
    return len(owed)


def read_responses(sock: socket.socket, count: int) -> list[Any]:
    sock.settimeout(READ_TIMEOUT_S)
    buffer = b""
    got: list[Any] = []
    while len(got) < count:
        while b"\n" not in buffer:
            chunk = sock.recv(65536)
            assert chunk, f"connection closed after {len(got)} of {count} responses"
            buffer += chunk
        line, buffer = buffer.split(b"\n", 1)
        message = json.loads(line)
        if isinstance(message, dict) and "method" in message and "id" not in message:
            continue  # notifications (chunks, events) do not count
        got.append(message)
    return got


@settings(
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    deadline=None,
)
@given(st.lists(lines, min_size=1, max_size=8), endings)
def test_daemon_answers_garbage_and_survives(
    daemon: DaemonProcess, batch: list[bytes], ending: str
) -> None:
    root = daemon.root
    sock = connect(socket_path(root), timeout_s=10)
    try:
        sock.sendall(b"".join(line + b"\n" for line in batch))
        owed = sum(expected_answers(line) for line in batch)
        if ending == "drop":
            sock.close()  # gone without reading: the daemon must not care
        else:
            if ending == "half_close":
                sock.shutdown(socket.SHUT_WR)
            answers = read_responses(sock, owed)
            for answer in answers:
                for item in answer if isinstance(answer, list) else [answer]:
                    assert item["jsonrpc"] == "2.0"
                    assert ("result" in item) != ("error" in item)
                    if "error" in item:
                        assert item["error"]["code"] != protocol.INTERNAL_ERROR, item
    finally:
        sock.close()
    with Client(root, timeout_s=10) as client:
        assert client.call("ping")["pid"] == daemon.pid


def test_huge_request_gets_an_error_and_the_connection_survives(daemon: DaemonProcess) -> None:
    sock = connect(socket_path(daemon.root), timeout_s=10)
    try:
        huge = protocol.encode(
            protocol.request("agent.send", {"agent": "target", "prompt": "x" * (3 << 20)}, 1)
        )
        sock.sendall(huge + protocol.encode(protocol.request("ping", None, 2)))
        first, second = read_responses(sock, 2)
        assert first["error"]["code"] == protocol.REQUEST_TOO_LARGE
        assert second["id"] == 2 and second["result"]["pong"] is True
    finally:
        sock.close()


def test_oversized_prompt_under_the_line_limit_is_invalid_params(daemon: DaemonProcess) -> None:
    with Client(daemon.root) as client:
        from substrat.errors import RpcError

        with pytest.raises(RpcError) as info:
            client.call("agent.send", {"agent": "target", "prompt": "y" * (300 << 10)})
        assert info.value.code == protocol.INVALID_PARAMS


def test_partial_line_then_hang_up_is_harmless(daemon: DaemonProcess, tmp_path: Path) -> None:
    for fragment in (b'{"jsonrpc":"2.0","method":"agent.cre', b"\x00" * 1000, b"[[[[[[["):
        sock = connect(socket_path(daemon.root), timeout_s=10)
        sock.sendall(fragment)
        sock.close()
    with Client(daemon.root) as client:
        assert client.call("ping")["pid"] == daemon.pid
        assert client.call("daemon.status")["connections"] == 1
