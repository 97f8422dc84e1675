"""Drive a real daemon over RPC while the oracle's model records what it acknowledged.

:class:`Driver` runs random operations on one connection, one at a time, so at
most one is ever in flight: root agents; turns whose scripted directives spawn,
message, ask, complete, broadcast and terminate; ``@inbox`` turns that consume
messages; cascading terminations; reads and acknowledgements of the user's
inbox. A success answer is the acknowledgement and goes into the
:class:`~oracle.model.Model`; a clean refusal (docs/rpc.md) is recorded as an
operation that did not happen; anything else stops the driver with the
operation left in flight, because its outcome is unknown.

The daemon must run without its wake loop (``--no-wake``): woken turns are
announced only by notifications, which a killed daemon may never have written
although the turns committed, so the disk could run ahead of the model by
more than the one operation the checks allow in flight.

:func:`check_offline` recovers a stopped root in-process and checks it with
:func:`oracle.checks.check_recovery`; :func:`check_served` compares what a
running daemon serves with the model. :mod:`oracle.powerloss` uses all three.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oracle.checks import Reads, check_recovery, expected, observe, outcome_if_applied
from oracle.errors import OracleViolation
from oracle.losses import Lost, lost_between
from oracle.model import Model, ModelAgent, ModelState
from substrat.agents import USER
from substrat.client import Client
from substrat.errors import DaemonDiedError, DaemonError, RpcError
from substrat.rpc.lock import RootLock

RPC_TIMEOUT_S = 30.0
MAX_LIVE_AGENTS = 14
MAX_ROOTS = 4
MAX_CHILDREN = 3
MAX_HISTORY_TURNS = 10_000
# Answers that mean "refused, nothing happened" (docs/rpc.md). Any other error is
# treated as an I/O failure whose outcome is unknown, like a crash.
CLEAN_REFUSALS = frozenset({-32001, -32002, -32003, -32009, -32010, -32013})


class _Unexpected(Exception):
    """An answer that is neither a success nor a clean refusal."""


# -- the workload ---------------------------------------------------------------------


class Driver(threading.Thread):
    """Runs operations over one connection, one at a time, recording them in the model."""

    def __init__(self, root: Path, model: Model, rng: random.Random, first_token: int) -> None:
        super().__init__(daemon=True, name="powerloss-driver")
        self.root = root
        self.model = model
        self.rng = rng
        self.token = first_token  # names and payloads stay unique across cycles
        self.stop = threading.Event()
        self.refused = 0
        self.unexpected: str | None = None
        self.violation: OracleViolation | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with Client(self.root, timeout_s=RPC_TIMEOUT_S) as client:
                while not self.stop.is_set():
                    self.token += 1
                    self._step(client)
        except DaemonDiedError:
            return  # the cut: the operation in flight stays undecided
        except _Unexpected as exc:
            self.unexpected = str(exc)
        except DaemonError as exc:
            self.unexpected = f"{type(exc).__name__}: {exc}"
        except OracleViolation as exc:
            self.violation = exc
        except BaseException as exc:  # surfaced by the campaign
            self.error = exc

    def _call(self, client: Client, method: str, params: dict[str, Any]) -> Any:
        try:
            return client.call(method, params)
        except RpcError as exc:
            if exc.code in CLEAN_REFUSALS:
                self.model.fail(f"{exc.code}: {exc.message}")
                self.refused += 1
                return None
            raise _Unexpected(f"{method} was answered {exc.code}: {exc.message}") from exc

    def _step(self, client: Client) -> None:
        state = self.model.state
        live = list(state.agents.values())
        roots = [a for a in live if a.parent_id is None]
        roll = self.rng.random()
        if not roots or (roll < 0.07 and len(roots) < MAX_ROOTS and len(live) < MAX_LIVE_AGENTS):
            self._create_root(client)
        elif roll < 0.14 and state.inboxes.get(USER):
            self._ack_user(client)
        elif roll < 0.16 and len(live) > 3:
            self._terminate(client, self.rng.choice(live))
        else:
            self._turn(client, self.rng.choice(live), len(live))

    def _create_root(self, client: Client) -> None:
        name = f"r{self.token}"
        provider = self.rng.choice(["scripted", "scripted", "paced"])
        params = {
            "name": name,
            "instructions": f"root {name}",
            "provider": provider,
            "model": self.rng.choice(["5ms", "20ms"]) if provider == "paced" else None,
        }
        self.model.begin(
            "create_root", name=name, instructions=params["instructions"], provider=provider
        )
        info = self._call(client, "agent.create", params)
        if info is not None:
            self.model.ack_create_root(info)

    def _turn(self, client: Client, agent: ModelAgent, live: int) -> None:
        prompt = self._prompt(agent, live)
        self.model.begin("turn", agent_id=agent.agent_id, prompt=prompt)
        result = self._call(client, "agent.send", {"agent": agent.agent_id, "prompt": prompt})
        if result is not None:
            self.model.ack_turn(result)

    def _prompt(self, agent: ModelAgent, live: int) -> str:
        rng, token = self.rng, self.token
        lines = [f"step {token}"]
        kids = sorted(agent.children)
        if kids and rng.random() < 0.05:
            gone = rng.choice(kids)
            lines.append(f"@terminate {gone}")
            kids.remove(gone)
        if live < MAX_LIVE_AGENTS and len(agent.children) < MAX_CHILDREN and rng.random() < 0.25:
            lines.append(f"@spawn c{token} child {token} of {agent.name}")
            kids.append(f"c{token}")
        if kids and rng.random() < 0.5:
            verb = rng.choice(["send", "send", "ask"])
            lines.append(f"@{verb} {rng.choice(kids)} {verb} {token}")
        if self.model.state.inboxes.get(agent.agent_id) and rng.random() < 0.6:
            lines.append("@inbox")
        if agent.parent_id is not None and rng.random() < 0.25:
            lines.append(f"@send parent up {token}")
        if rng.random() < 0.15:
            lines.append(f"@send user hello {token}")
        if rng.random() < 0.1:
            lines.append(f"@complete done {token}")
        if rng.random() < 0.1:
            lines.append(f"@broadcast all {token}")
        return "\n".join(lines)

    def _terminate(self, client: Client, agent: ModelAgent) -> None:
        self.model.begin("terminate", agent_id=agent.agent_id)
        result = self._call(client, "agent.terminate", {"agent": agent.agent_id, "cascade": True})
        if result is not None:
            self.model.ack_terminate(result["terminated"])

    def _ack_user(self, client: Client) -> None:
        listing = self._call(client, "inbox.list", {})
        ids = [m["message_id"] for m in listing["messages"]] if listing else []
        if not ids:
            return
        chosen = ids[: self.rng.randint(1, len(ids))]
        self.model.begin("ack_user", message_ids=chosen)
        result = self._call(client, "inbox.ack", {"message_ids": chosen})
        if result is not None:
            self.model.ack_user(result["acknowledged"])


# -- checks ------------------------------------------------------------------------------


async def _recover_and_check(root: Path, model: Model) -> tuple[ModelState, dict[str, Any]]:
    from substrat.daemon import build_registry
    from substrat.orchestrator import Orchestrator

    orch = await Orchestrator.open(root, registry=build_registry())
    try:
        report = orch.recovery_report.to_dict() if orch.recovery_report is not None else {}
        return check_recovery(model, orch), report
    finally:
        await orch.close()


def check_offline(root: Path, model: Model) -> tuple[ModelState, dict[str, Any]]:
    """Recover ``root`` without a daemon (holding its lock) and check it against ``model``.

    Returns the outcome the oracle accepted and the recovery report; raises
    :class:`OracleViolation` when no allowed outcome matches.
    """
    lock = RootLock.acquire(root)
    try:
        return asyncio.run(_recover_and_check(root, model))
    finally:
        lock.release()


@dataclass
class Served:
    """What a running daemon serves: agents, conversations (prompt, response), inboxes.

    RPC shows no transcripts, so conversations are compared by prompt and
    response here; :func:`check_offline` compares transcripts too.
    """

    agents: dict[str, tuple[str, str | None, str]] = field(default_factory=dict)
    turns: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    inboxes: dict[str, set[str]] = field(default_factory=dict)


def served_state(client: Client) -> Served:
    served = Served()
    for agent in client.call("agent.list"):
        agent_id = agent["agent_id"]
        served.agents[agent_id] = (agent["name"], agent["parent_id"], agent["instructions"])
        history = client.call("agent.history", {"agent": agent_id, "limit": MAX_HISTORY_TURNS})
        assert history["total"] <= MAX_HISTORY_TURNS, "history longer than one page"
        served.turns[agent_id] = [(t["prompt"], t["response"]) for t in history["turns"]]
        shown = client.call("agent.show", {"agent": agent_id})
        served.inboxes[agent_id] = {m["message_id"] for m in shown["inbox"]}
    served.inboxes[USER] = {m["message_id"] for m in client.call("inbox.list")["messages"]}
    return served


def model_served(state: ModelState) -> Served:
    """What the daemon must serve for the acknowledged ``state``."""
    want = Served()
    for agent in state.agents.values():
        want.agents[agent.agent_id] = (agent.name, agent.parent_id, agent.instructions)
        want.turns[agent.agent_id] = [(turn[0], turn[1]) for turn in agent.turns]
        want.inboxes[agent.agent_id] = set(state.inboxes.get(agent.agent_id, {}))
    want.inboxes[USER] = set(state.inboxes.get(USER, {}))
    return want


def served_differences(want: Served, got: Served) -> list[str]:
    """Human-readable differences; empty when the daemon serves exactly ``want``."""

    def label(agent_id: str) -> str:
        known = want.agents.get(agent_id) or got.agents.get(agent_id)
        return USER if agent_id == USER else f"{known[0] if known else '?'} ({agent_id[:8]})"

    out = [f"lost agent {label(a)}" for a in sorted(want.agents.keys() - got.agents.keys())]
    out += [f"unexpected agent {label(a)}" for a in sorted(got.agents.keys() - want.agents.keys())]
    for agent_id in sorted(want.agents.keys() & got.agents.keys()):
        if want.agents[agent_id] != got.agents[agent_id]:
            out.append(
                f"agent {label(agent_id)}: expected {want.agents[agent_id]}, "
                f"served {got.agents[agent_id]}"
            )
        w, g = want.turns[agent_id], got.turns[agent_id]
        if w != g:
            same = sum(1 for _ in zip(w, g, strict=False))
            at = next((i for i in range(same) if w[i] != g[i]), same)
            out.append(
                f"conversation of {label(agent_id)}: expected {len(w)} turns, served "
                f"{len(g)}; first difference at turn {at + 1}"
            )
    for endpoint in sorted(want.inboxes.keys() & got.inboxes.keys()):
        lost = want.inboxes[endpoint] - got.inboxes[endpoint]
        extra = got.inboxes[endpoint] - want.inboxes[endpoint]
        if lost:
            out.append(f"inbox of {label(endpoint)}: lost messages {sorted(lost)[:6]}")
        if extra:
            out.append(f"inbox of {label(endpoint)}: unexpected messages {sorted(extra)[:6]}")
    return out


def check_served(root: Path, model: Model, *, after_crash: bool) -> tuple[list[str], Lost]:
    """Differences between what the daemon serves and the model (empty when equal),
    and what of the acknowledged state the daemon no longer serves."""
    problems = []
    with Client(root, timeout_s=RPC_TIMEOUT_S) as client:
        status = client.call("daemon.status")
        if after_crash and status["previous_shutdown"] != "unclean":
            problems.append(
                f"the daemon did not notice the crash (previous_shutdown="
                f"{status['previous_shutdown']!r})"
            )
        got = served_state(client)
    want = model_served(model.state)
    return problems + served_differences(want, got), lost_between(want, got)


def lost_offline(root: Path, model: Model) -> Lost:
    """After :func:`check_offline` failed: what of the acknowledged state the root lost.

    The root is opened again (recovery is idempotent) and compared with each
    outcome the check allows: without the in-flight operation, and with it
    applied when the disk shows it (an applied termination or ``@inbox`` turn
    legitimately removes things). The smaller loss is the one reported.
    """
    lock = RootLock.acquire(root)
    try:
        return asyncio.run(_lost_offline(root, model))
    finally:
        lock.release()


async def _lost_offline(root: Path, model: Model) -> Lost:
    from substrat.daemon import build_registry
    from substrat.orchestrator import Orchestrator

    orch = await Orchestrator.open(root, registry=build_registry())
    try:
        reads = Reads(orch)
        got = observe(orch, reads)
        outcomes = [model.copy_state()]
        with contextlib.suppress(OracleViolation):  # an in-flight turn that is itself wrong
            applied = outcome_if_applied(model, orch, got, reads)
            if applied is not None:
                outcomes.append(applied)
        return min((lost_between(expected(s), got) for s in outcomes), key=lambda lost: lost.count)
    finally:
        await orch.close()
