"""Input that is not UTF-8 (finding 5 of the s17c outsider review).

A prompt on stdin or in argv, agent instructions, or a chat line holding a byte
that is not UTF-8 used to end the CLI with a UnicodeEncodeError traceback. Now
every request is checked where it is encoded (``protocol.check_text``): one line
naming the byte and where it is, exit 2, nothing sent; a chat goes on after the
bad line. A client that sends the same text as a JSON escape gets -32602.
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from substrat.client import Client
from substrat.eventlog import read_log
from substrat.rpc import protocol
from substrat.rpc.transport import socket_path
from tests.support import warm
from tests.support.cli import SUBSTRAT, as_json, cli_env, cli_root, run

pytestmark = pytest.mark.skipif(not SUBSTRAT, reason="the substrat console script is not installed")


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    yield from cli_root(tmp_path)


def run_bytes(
    root: Path, *args: bytes | str, stdin: bytes = b"", **env: str
) -> subprocess.CompletedProcess[bytes]:
    return warm.run(
        [SUBSTRAT, *args],
        capture_output=True,
        input=stdin,
        timeout=60,
        env={**cli_env(root), **env},
    )


def turns_logged(root: Path) -> int:
    return sum(
        e["event"] == "turn.start"
        for log in root.glob("agents/*/events.jsonl")
        for e in read_log(log).entries
    )


def test_bad_bytes_in_any_input_get_one_line_and_nothing_is_sent(root: Path) -> None:
    as_json(run(root, "--json", "agent", "create", "lead", "--provider", "scripted"))
    cases: list[tuple[list[bytes] | list[str], bytes, str, str]] = [
        (["agent", "send", "lead", "-"], b"abc\xff\n", "the prompt", "line 1, column 4"),
        # a locale whose stdin is strict would raise while reading, not encoding
        (["agent", "send", "lead", "-"], b"ok\nab\xfe", "the prompt", "line 2, column 3"),
        ([b"agent", b"send", b"lead", b"bad\xffarg"], b"", "the prompt", "line 1, column 4"),
        ([b"agent", b"create", b"x", b"-i", b"instr\xff"], b"", "the instructions", "column 6"),
    ]
    for args, stdin, where, place in cases:
        proc = run_bytes(root, *args, stdin=stdin, PYTHONIOENCODING="utf-8:strict")
        err = proc.stderr.decode()
        assert proc.returncode == 2, err
        assert "Traceback" not in err
        assert len(err.strip().splitlines()) == 1, err
        assert f"invalid UTF-8 in {where}" in err and place in err, err
        assert "byte 0x" in err and "nothing was sent" in err, err
    names = [a["name"] for a in as_json(run(root, "--json", "agent", "list"))]
    assert names == ["lead"]
    assert turns_logged(root) == 0


def test_a_new_root_is_not_made_for_bad_instructions(root: Path) -> None:
    proc = run_bytes(root, b"agent", b"create", b"x", b"-i", b"instr\xff")
    assert proc.returncode == 2, proc.stderr
    assert b"invalid UTF-8 in the instructions: byte 0xff" in proc.stderr
    assert not root.exists()


def test_chat_refuses_a_bad_line_and_goes_on(root: Path) -> None:
    as_json(run(root, "--json", "agent", "create", "lead", "--provider", "scripted"))
    proc = run_bytes(root, "chat", "lead", stdin=b"first\nli\xffne\nthird\n")
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    assert "invalid UTF-8 in the prompt: byte 0xff at line 1, column 3" in err, err
    assert err.count("committed") == 2, err
    assert turns_logged(root) == 2


def test_the_daemon_refuses_a_surrogate_escape_from_any_client(root: Path) -> None:
    as_json(run(root, "--json", "agent", "create", "lead", "--provider", "scripted"))
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(socket_path(root)))
        sock.sendall(
            b'{"jsonrpc":"2.0","id":7,"method":"agent.send",'
            b'"params":{"agent":"lead","prompt":"a\\udcff"}}\n'
        )
        answer = protocol.loads(sock.makefile("rb").readline())
    assert answer["id"] == 7
    assert answer["error"]["code"] == protocol.INVALID_PARAMS
    assert "invalid UTF-8 in the prompt: byte 0xff" in answer["error"]["message"]
    with Client(root) as client:  # the daemon is alive and took nothing
        assert client.call("ping")["pid"] > 0
    assert turns_logged(root) == 0
