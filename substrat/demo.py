"""``substrat demo``: a daemon killed with SIGKILL mid-run, restarted, and what came back.

Also home of the ``paced`` provider: the scripted provider that thinks for a
while before it answers, so a demo (or a crash test) can kill the daemon while a
turn is visibly in flight. Its model name is the pause per turn, e.g. ``"400ms"``;
a prompt line that starts with ``@pace 3000ms`` sets that one turn's pause
instead, so only the turn that must be in flight when the kill lands is slow.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from substrat.errors import ProviderError
from substrat.providers.base import AgentContext, ProviderSession, TurnRecord
from substrat.providers.scripted import ScriptedProvider

DEFAULT_PACE = "20ms"
MAX_PACE_MS = 10_000
_PACE = re.compile(r"(\d{1,5})ms")
_PACE_LINE = re.compile(r"^@pace (\S+)(?:\s|$)", re.MULTILINE)


def pace_seconds(model: str) -> float:
    """The pause per turn a ``paced`` model name asks for; ValueError if malformed."""
    match = _PACE.fullmatch(model)
    if match is None or int(match.group(1)) > MAX_PACE_MS:
        raise ValueError(
            f"paced model {model!r} must be a pause like '40ms' (at most {MAX_PACE_MS}ms)"
        )
    return int(match.group(1)) / 1000.0


def turn_pause_s(prompt: str, model_pause_s: float) -> float:
    """One turn's pause: the first prompt line starting ``@pace <N>ms`` sets it, else the
    model's. A malformed one fails the turn (ProviderError) rather than being ignored."""
    match = _PACE_LINE.search(prompt)
    if match is None:
        return model_pause_s
    try:
        return pace_seconds(match.group(1))
    except ValueError:
        raise ProviderError(
            f"@pace {match.group(1)!r} must be a pause like '40ms' (at most {MAX_PACE_MS}ms); "
            "the turn was not run"
        ) from None


class PacedSession:
    def __init__(self, inner: ProviderSession, pause_s: float) -> None:
        self._inner = inner
        self._pause_s = pause_s

    async def send(self, prompt: str) -> AsyncIterator[str]:
        await asyncio.sleep(turn_pause_s(prompt, self._pause_s))
        async for chunk in self._inner.send(prompt):
            yield chunk

    def last_transcript(self) -> list[dict[str, Any]]:
        return self._inner.last_transcript()

    async def suspend(self) -> bytes:
        return await self._inner.suspend()

    async def stop(self) -> None:
        await self._inner.stop()


class PacedProvider:
    """Scripted behaviour, streamed slowly (see the module docstring)."""

    name = "paced"
    default_model = DEFAULT_PACE

    def __init__(self) -> None:
        self._scripted = ScriptedProvider()

    def models(self) -> list[str]:
        return [DEFAULT_PACE, "5ms", "100ms"]

    def check_model(self, model: str) -> None:
        """A malformed pause is refused before the agent is made (and, on a new root, by
        ``agent create`` before the root is)."""
        pace_seconds(model)

    async def create(
        self, model: str, system_prompt: str, context: AgentContext
    ) -> ProviderSession:
        inner = await self._scripted.create(model, system_prompt, context)
        return PacedSession(inner, pace_seconds(model))

    async def restore(
        self,
        blob: bytes,
        history: list[TurnRecord],
        *,
        model: str,
        system_prompt: str,
        context: AgentContext,
    ) -> ProviderSession:
        inner = await self._scripted.restore(
            blob, history, model=model, system_prompt=system_prompt, context=context
        )
        return PacedSession(inner, pace_seconds(model))


# -- the demo scenario ---------------------------------------------------------------------

DEMO_PACE = DEFAULT_PACE
"""Lead's (and so its crew's) own pace: the turns that complete take no longer than this."""
SCOUT_PACE = "600ms"
"""The scout's work (an ``@pace`` line in lead's message): in flight when the kill lands."""
THIRD_TURN_PACE = "3000ms"
"""Lead's third turn: the kill cuts it long before its end, so the margin costs nothing."""
KILL_DELAY_S = 0.15
"""How long after the in-flight turn starts the daemon is killed (well inside the pause)."""
SETTLE_TIMEOUT_S = 20.0

Say = Callable[[str], None]


def _quiet(_line: str) -> None:
    return None


def run_demo(
    root: Path | None = None,
    *,
    say: Say = _quiet,
    keep: bool = False,
    timeout_s: float = 30.0,
) -> dict[str, Any]:
    """Run the scenario and return what happened (``substrat demo`` renders it).

    1. start a daemon on a fresh root; create ``lead`` (paced provider);
    2. lead spawns ``scout`` and ``builder`` and sends them work (acknowledged);
    3. while lead runs a third turn and scout works on its message (both slowed down by
       ``@pace`` lines; the turns that complete take lead's own 20 ms), SIGKILL;
    4. restart: recovery reports the turns lost in flight and the messages it
       redelivers; every acknowledged turn is still in lead's history;
    5. let the woken agents finish, stop cleanly, and fsck the root.
    """
    from substrat import fsck
    from substrat.client import Client, DaemonProcess

    made = root is None
    path = Path(tempfile.mkdtemp(prefix="substrat-demo-")) if root is None else root
    args = ["--heartbeat-s", "1", "--grace-s", "5"]
    first = DaemonProcess(path, daemon_args=args)
    second = DaemonProcess(path, daemon_args=args)
    result: dict[str, Any] = {"root": str(path)}
    try:
        first.start()
        result["first_pid"] = first.pid
        say(f"started the daemon [bold](pid {first.pid})[/] on {path}")
        acked = _drive(path, timeout_s, say)
        result["acknowledged"] = acked
        lead_id = acked[0]["agent_id"]
        result["in_flight"] = _kill_mid_turn(path, first, lead_id, timeout_s, say)
        second.start()
        result["second_pid"] = second.pid
        say(f"restarted the daemon [bold](pid {second.pid})[/]")
        with Client(path, timeout_s=timeout_s) as client:
            client.call("events.subscribe", {"events": ["daemon.recovered"]})
            note = client.next_notification(5.0)
            result["recovered"] = note[1] if note is not None else None
            history = client.call("agent.history", {"agent": lead_id})
            logged = [(t["turn_id"], t["response"]) for t in history["turns"]]
            result["survived"] = all((a["turn_id"], a["response"]) in logged for a in acked)
            _settle(client, SETTLE_TIMEOUT_S)
            result["tree"] = client.call("agent.tree")
            result["histories"] = {
                a["path"]: client.call("agent.history", {"agent": a["agent_id"]})["turns"]
                for a in client.call("agent.list")
            }
        second.terminate()
        say("stopped the daemon cleanly")
        report = fsck.check(path)
        result["fsck"] = report.to_dict()
        say(f"fsck: exit {report.exit_code} ({'clean' if not report.problems else 'damage'})")
        return result
    finally:
        first.kill()
        second.kill()
        if made and not keep:
            shutil.rmtree(path, ignore_errors=True)


def _drive(root: Path, timeout_s: float, say: Say) -> list[dict[str, Any]]:
    from substrat.client import Client

    acked: list[dict[str, Any]] = []
    with Client(root, timeout_s=timeout_s) as client:
        lead = client.call(
            "agent.create",
            {
                "name": "lead",
                "instructions": "You run a small crew.",
                "provider": "paced",
                "model": DEMO_PACE,
            },
        )
        say(
            f"created [bold]lead[/] ({lead['agent_id'][:8]}), paced at {DEMO_PACE} per turn; "
            "@pace lines slow down the turns the kill will cut"
        )
        prompts = [
            "Assemble the crew.\n@spawn scout Explore and report.\n@spawn builder Build things.",
            f"Get going.\n@send scout Map the valley.\\n@pace {SCOUT_PACE}"
            "\n@send builder Lay the foundations.\n@send builder Raise the walls.",
        ]
        for prompt in prompts:
            turn = client.call("agent.send", {"agent": lead["agent_id"], "prompt": prompt})
            acked.append(turn)
            say(f"lead turn {turn['turn_id']} acknowledged: {_first_line(prompt)}")
    return acked


def _kill_mid_turn(
    root: Path, daemon: Any, lead_id: str, timeout_s: float, say: Say
) -> dict[str, Any]:
    from substrat.client import Client
    from substrat.errors import DaemonError

    outcome: dict[str, Any] = {"prompt": f"Plan the next phase.\n@pace {THIRD_TURN_PACE}"}
    watcher = Client(root, timeout_s=timeout_s).connect()
    watcher.call("events.subscribe", {"events": ["turn.started"], "replay": False})

    def third_turn() -> None:
        try:
            with Client(root, timeout_s=timeout_s) as client:
                outcome["result"] = client.call(
                    "agent.send", {"agent": lead_id, "prompt": outcome["prompt"]}
                )
        except DaemonError as exc:
            outcome["error"] = str(exc)

    worker = threading.Thread(target=third_turn, daemon=True)
    worker.start()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        note = watcher.next_notification(max(0.1, deadline - time.monotonic()))
        if note is not None and note[1].get("agent_id") == lead_id:
            outcome["turn_id"] = note[1].get("turn_id")
            break
    time.sleep(KILL_DELAY_S)
    daemon.kill()
    say(f"[bold red]SIGKILL[/] the daemon while lead runs turn {outcome.get('turn_id')}")
    worker.join(timeout_s)
    watcher.close()
    if "error" in outcome:
        say(f"the client was told: [italic]{outcome['error'].split(';')[0]}[/]")
    return outcome


def _settle(client: Any, timeout_s: float) -> None:
    """Wait until no agent has pending messages and no turn runs (the wake loop is done)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = client.call("daemon.status")
        pending = sum(a["pending_messages"] for a in client.call("agent.list"))
        if status["busy_turns"] == 0 and pending == 0:
            return
        time.sleep(0.1)


def _first_line(text: str) -> str:
    return text.splitlines()[0] if text else ""
