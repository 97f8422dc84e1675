"""An endpoint that keeps the connection alive but sends no answer does not hang a turn.

Proxies (OpenRouter, for one) send SSE comments while the model works; they
reset the HTTP read timeout, so a stuck upstream behind them would hold the
turn, and the agent, forever. ``stall_timeout_s`` bounds the time between two
pieces of the answer; a stall is retried like a dropped stream.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from substrat.client import Client, DaemonProcess, RpcError
from substrat.providers.openai_config import OpenAIConfig
from tests.support.chat_server import ChatServer, Reply, text
from tests.support.context import RecordingContext
from tests.support.openai_provider import make_provider, run, turn


def stalled(after_chunks: int) -> Reply:
    return Reply(text="partial answer", stall_after_chunks=after_chunks, keepalive_s=0.05)


@pytest.mark.timeout(60)  # without the stall timeout this test hangs
def test_a_stream_of_keepalives_only_is_cut_and_retried() -> None:
    with ChatServer() as server:
        server.script(stalled(3), text("partial answer"))
        # The read timeout alone never fires: a comment comes every 0.05 s.
        provider, sleep = make_provider(server, request_timeout_s=0.3, stall_timeout_s=1.0)

        async def main() -> tuple[str, RecordingContext]:
            context = RecordingContext()
            session = await provider.create("m", "", context)
            response, _ = await turn(session, "hello")
            return response, context

        try:
            response, context = run(main())
        finally:
            server.release()
    assert response == "partial answer"  # what was shown before the stall is not repeated
    assert len(server.requests) == 2 and len(sleep.delays) == 1
    [(_, retrying)] = [r for r in context.reports if r[0] == "turn.retrying"]
    assert "no part of the answer for 1 s" in retrying["error"]


def test_the_stall_timeout_comes_from_the_environment() -> None:
    config = OpenAIConfig.from_env({"SUBSTRAT_OPENAI_STALL_TIMEOUT_S": "42"})
    assert config.stall_timeout_s == 42.0
    assert OpenAIConfig().stall_timeout_s == 600.0


@pytest.mark.timeout(90)
def test_a_stalled_endpoint_fails_the_daemons_turn_instead_of_hanging(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with ChatServer() as server:
        env = dict(os.environ)
        env.update(
            {
                "SUBSTRAT_OPENAI_BASE_URL": server.base_url,
                "SUBSTRAT_OPENAI_API_KEY": "loopback",
                "SUBSTRAT_OPENAI_MAX_RETRIES": "0",
                "SUBSTRAT_OPENAI_TIMEOUT_S": "30",
                "SUBSTRAT_OPENAI_STALL_TIMEOUT_S": "1",
            }
        )
        try:
            with DaemonProcess(root, env=env).start(timeout_s=30.0):
                with Client(root, timeout_s=60.0) as client:
                    client.call("agent.create", {"name": "a", "provider": "openai", "model": "m"})
                    server.script(stalled(0))
                    with pytest.raises(RpcError) as failed:
                        client.call("agent.send", {"agent": "a", "prompt": "hello"})
                    # The agent is free again: the next turn runs.
                    assert client.call("agent.send", {"agent": "a", "prompt": "again"})
        finally:
            server.release()
    assert "no part of the answer for 1 s" in str(failed.value)
