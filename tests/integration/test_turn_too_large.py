"""A turn too large for the log fails cleanly, and a restart does not call it lost.

An openai answer of 600 000 characters streams completely, but its
``turn.complete`` (the answer, and the transcript that repeats it) is over the
log's 1 MiB limit for one entry. The turn used to fail with a message for
developers ("keep large payloads out of the log") and no ``turn.failed`` in
the log, so the next daemon reported it lost in a crash and told the agent so.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from substrat.client import Client, DaemonProcess, RpcError
from substrat.eventlog import read_log
from tests.support.chat_server import ChatServer, text

START_TIMEOUT_S = 30.0


def test_an_answer_too_large_to_log_fails_the_turn_and_is_not_reported_lost(
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"
    with ChatServer() as server:
        env = dict(os.environ)
        env.update({"SUBSTRAT_OPENAI_BASE_URL": server.base_url, "SUBSTRAT_OPENAI_API_KEY": "k"})
        with DaemonProcess(root, env=env).start(timeout_s=START_TIMEOUT_S):
            with Client(root) as client:
                info = client.call(
                    "agent.create", {"name": "a", "provider": "openai", "model": "m"}
                )
                server.script(text("y" * 600_000, chunk_chars=50_000))
                with pytest.raises(RpcError) as failed:
                    client.call("agent.send", {"agent": "a", "prompt": "write a lot"})
        with DaemonProcess(root, env=env).start(timeout_s=START_TIMEOUT_S):
            with Client(root) as client:
                shown = client.call("agent.show", {"agent": "a"})
                client.call("agent.send", {"agent": "a", "prompt": "briefly, then"})
        last = server.requests[-1].messages
    assert "turn t1 is too large to keep" in str(failed.value)
    assert "ask for a shorter answer" in str(failed.value)
    entries = read_log(root / "agents" / info["session_id"] / "events.jsonl").entries
    [failure] = [e["data"] for e in entries if e["event"] == "turn.failed"]
    assert failure["turn_id"] == "t1" and "too large to keep" in failure["error"]
    assert shown["lost_turn"] is None
    # the endpoint never sees the turn the log does not have, nor a "lost in flight" notice
    assert last == [{"role": "user", "content": "briefly, then"}]
