"""A woken agent that keeps failing is reported once, not once per retry.

The wake loop retries an agent whose turn failed (its messages stay in its
inbox), every few seconds for as long as the endpoint is down or rejects the
key. Each failure used to put one more error message in the parent's inbox
(or the user's): hundreds an hour, and for a parent agent a turn of its own
for each. Now a failing streak is reported once; a turn that succeeds ends it.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from substrat.client import Client, DaemonProcess
from tests.support.chat_server import ChatServer, Reply, echo, error, tool_call, tools

START_TIMEOUT_S = 30.0
WAIT_S = 60.0


class Endpoint:
    """b1 forwards each prompt to b2; b2's requests fail while ``failing`` is set."""

    def __init__(self) -> None:
        self.failing = threading.Event()
        self.b2_failures = 0

    def __call__(self, body: dict[str, Any]) -> Reply:
        messages = body["messages"]
        if messages[0]["content"] == "b2":
            if self.failing.is_set():
                self.b2_failures += 1
                return error(401, "Incorrect API key provided")
            return echo(body)
        if messages[-1]["role"] == "user":
            job = messages[-1]["content"]
            return tools(tool_call("send_message", {"recipient": "b2", "text": job}))
        return Reply(text="forwarded")


def wait_for(condition: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def pending(client: Client, name: str) -> int:
    [agent] = [a for a in client.call("agent.list") if a["name"] == name]
    return int(agent["pending_messages"])


def errors_in_user_inbox(client: Client) -> list[str]:
    return [m["payload"] for m in client.call("inbox.list")["messages"] if m["kind"] == "error"]


def openai_env(server: ChatServer) -> dict[str, str]:
    """The daemon's environment: the openai provider on the loopback server, no retries."""
    return {
        **os.environ,
        "SUBSTRAT_OPENAI_BASE_URL": server.base_url,
        "SUBSTRAT_OPENAI_API_KEY": "loopback",
        "SUBSTRAT_OPENAI_MAX_RETRIES": "0",
    }


def create_agents(client: Client, *names: str) -> None:
    """Root agents on the openai provider, each instructed with its own name."""
    for name in names:
        client.call(
            "agent.create",
            {"name": name, "instructions": name, "provider": "openai", "model": "m"},
        )


def test_a_failing_woken_agent_is_reported_once_per_failing_streak(tmp_path: Path) -> None:
    root = tmp_path / "root"
    endpoint = Endpoint()
    with ChatServer(endpoint) as server:
        with DaemonProcess(root, env=openai_env(server)).start(timeout_s=START_TIMEOUT_S):
            with Client(root) as client:
                create_agents(client, "b1", "b2")
                endpoint.failing.set()
                client.call("agent.send", {"agent": "b1", "prompt": "job one"})
                wait_for(lambda: endpoint.b2_failures >= 4, "b2 to be retried")
                endpoint.failing.clear()
                wait_for(lambda: pending(client, "b2") == 0, "b2 to read its message")
                first_streak = errors_in_user_inbox(client)
                endpoint.failing.set()
                failures = endpoint.b2_failures
                client.call("agent.send", {"agent": "b1", "prompt": "job two"})
                wait_for(lambda: endpoint.b2_failures >= failures + 3, "b2 to fail again")
                both_streaks = errors_in_user_inbox(client)
                endpoint.failing.clear()
    assert len(first_streak) == 1, first_streak
    assert "b2 failed a turn" in first_streak[0] and "401" in first_streak[0]
    assert "stay in its inbox" in first_streak[0]
    assert len(both_streaks) == 2, both_streaks


class TwoWorkers:
    """b1 forwards each prompt to the agent it names; b2's requests always fail, b3's
    succeed."""

    def __init__(self) -> None:
        self.b2_failures = 0
        self.b3_turns = 0

    def __call__(self, body: dict[str, Any]) -> Reply:
        messages = body["messages"]
        who = messages[0]["content"]
        if who == "b2":
            self.b2_failures += 1
            return error(401, "Incorrect API key provided")
        if who == "b3":
            self.b3_turns += 1
            return echo(body)
        if messages[-1]["role"] == "user":
            recipient, _, job = messages[-1]["content"].partition(" ")
            return tools(tool_call("send_message", {"recipient": recipient, "text": job}))
        return Reply(text="forwarded")


def test_a_failing_woken_agent_does_not_keep_the_others_waiting(tmp_path: Path) -> None:
    """b2 holds the oldest pending message and fails every turn; b3, sent to later, is
    still woken and reads its message while b2 keeps failing (it used to be retried back
    to back, as the oldest, and b3 waited for as long as b2's endpoint was down)."""
    root = tmp_path / "root"
    endpoint = TwoWorkers()
    with ChatServer(endpoint) as server:
        with DaemonProcess(root, env=openai_env(server)).start(timeout_s=START_TIMEOUT_S):
            with Client(root) as client:
                create_agents(client, "b1", "b2", "b3")
                client.call("agent.send", {"agent": "b1", "prompt": "b2 job for b2"})
                wait_for(lambda: endpoint.b2_failures >= 3, "b2 to fail a few times")
                client.call("agent.send", {"agent": "b1", "prompt": "b3 job for b3"})
                wait_for(lambda: pending(client, "b3") == 0, "b3 to read its message")
                b2_waiting = pending(client, "b2")
    assert endpoint.b3_turns == 1
    assert b2_waiting == 1  # b2 keeps its message for when its endpoint works again
