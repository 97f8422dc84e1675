"""The daemon, as a real process, SIGKILLed in the middle of an openai tool-call round.

The loopback server holds the chosen request open, the test kills the daemon
while the turn waits on it, starts a new daemon on the same root and sends
the agent another prompt. The conversation the server receives must be
accepted (no orphan tool call) and equal the one the log holds: what the
endpoint was sent before the kill, minus only the turn that was in flight.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from substrat.client import Client, DaemonProcess
from substrat.conversation import conversation_from_log
from substrat.providers.base import TurnRecord
from substrat.providers.chat_history import conversation_problems, rebuild
from tests.support.chat_server import ChatServer, Recorded, Reply, echo, text, tool_call, tools

SYSTEM = "You lead."
WORK = "Greet the user twice, then report."
START_TIMEOUT_S = 30.0


def plan(messages: list[dict[str, Any]]) -> tuple[bool, int]:
    """Is this request part of the WORK turn, and how many tool rounds has it had?"""
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    if not messages[users[-1]]["content"].endswith(WORK):
        return False, 0
    return True, sum(1 for m in messages[users[-1] :] if m.get("tool_calls"))


def answer(body: dict[str, Any]) -> Reply:
    working, rounds = plan(body["messages"])
    if not working:
        return echo(body)
    if rounds == 0:
        return tools(
            tool_call("send_message", {"recipient": "user", "text": "hello once"}), say="Sure."
        )
    if rounds == 1:
        return tools(tool_call("send_message", {"recipient": "user", "text": "hello twice"}))
    return text("Greeted the user twice.", chunk_chars=3)


def killing_responder(point: str, reached: threading.Event) -> Callable[[dict[str, Any]], Reply]:
    """``answer``, except that the request at ``point`` is held while the test kills the daemon."""
    target = {"ask": 0, "mid-round": 1, "final": 2, "final-stream": 2}[point]

    def respond(body: dict[str, Any]) -> Reply:
        working, rounds = plan(body["messages"])
        if working and rounds == target and not reached.is_set():
            reached.set()
            if point == "final-stream":
                return Reply(text="Greeted the user twice.", chunk_chars=3, stall_after_chunks=3)
            return Reply(hang=True)
        return answer(body)

    return respond


def daemon_env(server: ChatServer) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "SUBSTRAT_OPENAI_BASE_URL": server.base_url,
            "SUBSTRAT_OPENAI_API_KEY": "loopback",
            "SUBSTRAT_OPENAI_TIMEOUT_S": "30",
        }
    )
    return env


def logged_history(root: Path, session_id: str) -> list[TurnRecord]:
    return conversation_from_log(root / "agents" / session_id / "events.jsonl")


@pytest.mark.parametrize("point", ["ask", "mid-round", "final", "final-stream"])
def test_sigkill_during_a_tool_round_recovers_to_an_accepted_logged_conversation(
    tmp_path: Path, point: str
) -> None:
    root = tmp_path / "root"
    reached = threading.Event()
    with ChatServer(killing_responder(point, reached)) as server:
        env = daemon_env(server)
        daemon = DaemonProcess(root, env=env).start(timeout_s=START_TIMEOUT_S)
        try:
            with Client(root) as client:
                info = client.call(
                    "agent.create",
                    {"name": "lead", "instructions": SYSTEM, "provider": "openai", "model": "m"},
                )
                client.call("agent.send", {"agent": "lead", "prompt": "warm up"})
            outcome: list[BaseException] = []

            def doomed_turn() -> None:
                try:
                    with Client(root) as doomed:
                        doomed.call("agent.send", {"agent": "lead", "prompt": WORK})
                except BaseException as exc:  # the daemon dies under this call
                    outcome.append(exc)

            worker = threading.Thread(target=doomed_turn)
            worker.start()
            assert reached.wait(START_TIMEOUT_S), "the daemon never reached the crash point"
            daemon.kill()
            worker.join(START_TIMEOUT_S)
            assert outcome, "the turn must not have been acknowledged"
        finally:
            daemon.kill()
            server.release()

        sent_before = list(server.accepted())
        restarted = DaemonProcess(root, env=env).start(timeout_s=START_TIMEOUT_S)
        try:
            with Client(root) as client:
                client.call("agent.send", {"agent": "lead", "prompt": "What happened?"})
                client.call("agent.send", {"agent": "lead", "prompt": WORK})
                inbox = client.call("inbox.list")["messages"]
        finally:
            restarted.kill()
        assert not server.rejected(), server.rejected()[0].problem
        after: list[Recorded] = server.requests[len(server.requests) - 4 :]

    history = logged_history(root, info["session_id"])
    assert [
        t.prompt.endswith(p)
        for t, p in zip(history, ("warm up", "What happened?", WORK), strict=True)
    ] == [True] * 3
    first_after = after[0]
    # Everything the endpoint saw before the kill, minus the in-flight turn.
    warm_up = sent_before[0]
    assert first_after.messages == warm_up.messages + [
        history[0].transcript[-1],
        history[1].transcript[0],
    ]
    assert "was lost in flight" in history[1].transcript[0]["content"]
    assert after[-1].messages + [history[2].transcript[-1]] == rebuild(SYSTEM, history)
    # The cut turn's messages never reached the user; the re-run's did, once each.
    assert [m["payload"] for m in inbox] == ["hello once", "hello twice"]
    assert conversation_problems(SYSTEM, history) == []
