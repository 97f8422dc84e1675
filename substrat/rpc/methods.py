"""The daemon's RPC methods: a thin layer from JSON-RPC calls to the orchestrator.

Each method checks its parameters (declared next to it), calls the
orchestrator, and returns plain JSON. docs/rpc.md documents every method; keep
the two in step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from substrat.prompts import MAX_PROMPT_CHARS, check_prompt
from substrat.rpc import protocol
from substrat.rpc.protocol import EVENT_NAMES, RequestError
from substrat.rpc.server import Call, Method, MethodTable, Param

if TYPE_CHECKING:
    from substrat.orchestrator import Orchestrator
    from substrat.rpc.server import RpcServer

MAX_NAME_CHARS = 64
MAX_REF_CHARS = 4096
MAX_INSTRUCTIONS_CHARS = 64 * 1024
MAX_HISTORY_TURNS = 10_000
MAX_ACK_IDS = 10_000


class DaemonView(Protocol):
    """What the methods need of the daemon (substrat.daemon.Daemon implements it)."""

    orch: Orchestrator
    server: RpcServer
    heartbeat_s: float
    pid: int

    def uptime_s(self) -> float: ...

    def status(self) -> dict[str, Any]: ...

    def recovery_notice(self) -> dict[str, Any] | None: ...

    def request_stop(self, reason: str) -> None: ...


_STR = (str,)
_BOOL = (bool,)
_INT = (int,)


def build_methods(daemon: DaemonView) -> MethodTable:
    """The method table served by ``daemon``."""
    table = MethodTable()

    async def ping(call: Call) -> dict[str, Any]:
        # not from status(): a liveness probe reads nothing of the root's agents
        # "stopping": in its stop's grace it still answers connections made before, and
        # refuses new work there; a start does not take it for a daemon that serves
        return {
            "pong": True,
            "pid": daemon.pid,
            "uptime_s": daemon.uptime_s(),
            "stopping": daemon.server.stopping,
        }

    async def status(call: Call) -> dict[str, Any]:
        return daemon.status()

    async def shutdown(call: Call) -> dict[str, Any]:
        daemon.request_stop("daemon.shutdown request")
        return {"stopping": True, "pid": daemon.status()["pid"]}

    async def methods(call: Call) -> list[str]:
        return table.names()

    async def create(call: Call) -> dict[str, Any]:
        p = call.params
        info = await daemon.orch.create_root(
            p["name"], p["instructions"], provider=p["provider"], model=p["model"]
        )
        return info.to_dict()

    async def send(call: Call) -> dict[str, Any]:
        p = call.params
        check_prompt(p["prompt"])  # before the agent is looked up, as before; -32602
        agent = daemon.orch.get(p["agent"])
        on_chunk = on_status = None
        if p["stream"]:

            def on_chunk(text: str) -> None:
                call.notify(
                    "turn.chunk",
                    {"request_id": call.request_id, "agent_id": agent.agent_id, "text": text},
                )

            def on_status(event: str, data: dict[str, Any]) -> None:
                status = event.removeprefix("turn.")
                call.notify(
                    "turn.status",
                    {**data, "request_id": call.request_id, "status": status},
                )

        result = await daemon.orch.run_turn(
            agent.agent_id,
            p["prompt"],
            on_chunk=on_chunk,
            on_status=on_status if p["progress"] else None,
            wait=p["wait"],
        )
        return result.to_dict()

    async def list_agents(call: Call) -> list[dict[str, Any]]:
        agents = daemon.orch.agents(include_terminated=call.params["all"])
        return [info.to_dict() for info in agents]

    async def tree(call: Call) -> list[dict[str, Any]]:
        return daemon.orch.tree_view()

    async def show(call: Call) -> dict[str, Any]:
        return daemon.orch.inspect(call.params["agent"])

    async def history(call: Call) -> dict[str, Any]:
        p = call.params
        info = daemon.orch.lookup(p["agent"])
        turns, gaps, deleted = daemon.orch.history_and_gaps(info.agent_id)
        limit = p["limit"]
        if limit < 0 or limit > MAX_HISTORY_TURNS:
            raise RequestError(
                protocol.INVALID_PARAMS, f"limit must be between 0 and {MAX_HISTORY_TURNS}"
            )
        shown = turns[-limit:] if limit else []
        return {
            "agent": info.to_dict(),
            "total": len(turns),
            # entries 1..this of its log were deleted by the compaction policy (their
            # turns are still in ``turns``, kept in the log's base): 0 if none were
            "deleted_through": deleted,
            # seq ranges of entries missing from its log (segments or lines removed by
            # hand or by a failing disk): lost, and any turn they held with them
            "missing": [list(gap) for gap in gaps],
            "turns": [
                {"turn_id": t.turn_id, "prompt": t.prompt, "response": t.response} for t in shown
            ],
        }

    async def terminate(call: Call) -> dict[str, Any]:
        p = call.params
        orch = daemon.orch
        node = orch.resolve_live(p["agent"])
        paths = {
            m.agent_id: orch.tree.path(m.agent_id)
            for m in orch.tree.subtree_leaves_first(node.agent_id)
        }
        ids = await orch.terminate(node.agent_id, cascade=p["cascade"])
        return {"terminated": ids, "paths": [paths.get(i, i) for i in ids]}

    async def inbox_list(call: Call) -> dict[str, Any]:
        return {"messages": [m.to_dict() for m in daemon.orch.user_inbox()]}

    async def inbox_ack(call: Call) -> dict[str, Any]:
        ids = call.params["message_ids"]
        if len(ids) > MAX_ACK_IDS or not all(isinstance(i, str) for i in ids):
            raise RequestError(
                protocol.INVALID_PARAMS, f"message_ids must be up to {MAX_ACK_IDS} strings"
            )
        return {"acknowledged": daemon.orch.ack_user_messages(ids)}

    async def inbox_collect(call: Call) -> dict[str, Any]:
        messages = await daemon.orch.collect_user_inbox()
        return {"messages": [m.to_dict() for m in messages]}

    async def subscribe(call: Call) -> dict[str, Any]:
        p = call.params
        wanted = p["events"] or []
        if not all(isinstance(e, str) for e in wanted):
            raise RequestError(protocol.INVALID_PARAMS, "events must be a list of strings")
        unknown = sorted(set(wanted) - EVENT_NAMES)
        if unknown:
            raise RequestError(
                protocol.INVALID_PARAMS,
                f"unknown event(s) {', '.join(unknown)}; known: {', '.join(sorted(EVENT_NAMES))}",
            )
        call.connection.subscription = frozenset(wanted)
        notice = daemon.recovery_notice() if p["replay"] else None
        if notice is not None and call.connection.wants("daemon.recovered"):
            call.notify("daemon.recovered", notice)
        return {
            "subscribed": sorted(wanted) or "all",
            "heartbeat_s": daemon.heartbeat_s,
            "pid": daemon.status()["pid"],
        }

    async def unsubscribe(call: Call) -> dict[str, Any]:
        call.connection.subscription = None
        return {"subscribed": False}

    agent_ref = Param("agent", _STR, max_chars=MAX_REF_CHARS)
    for method in (
        Method("ping", ping, while_stopping=True),
        Method("daemon.status", status, while_stopping=True),
        Method("daemon.shutdown", shutdown, while_stopping=True),
        Method("rpc.methods", methods, while_stopping=True),
        Method(
            "agent.create",
            create,
            (
                Param("name", _STR, max_chars=MAX_NAME_CHARS),
                Param("instructions", _STR, False, "", MAX_INSTRUCTIONS_CHARS),
                Param("provider", _STR, False, "scripted", MAX_NAME_CHARS),
                Param("model", _STR, False, None, 256),
            ),
        ),
        Method(
            "agent.send",
            send,
            (
                agent_ref,
                Param("prompt", _STR, max_chars=MAX_PROMPT_CHARS),
                Param("stream", _BOOL, False, False),
                Param("wait", _BOOL, False, False),
                Param("progress", _BOOL, False, False),
            ),
            is_turn=True,
        ),
        Method("agent.list", list_agents, (Param("all", _BOOL, False, False),)),
        Method("agent.tree", tree),
        Method("agent.show", show, (agent_ref,)),
        Method("agent.history", history, (agent_ref, Param("limit", _INT, False, 1000))),
        Method("agent.terminate", terminate, (agent_ref, Param("cascade", _BOOL, False, False))),
        Method("inbox.list", inbox_list),
        Method("inbox.ack", inbox_ack, (Param("message_ids", (list,)),)),
        Method("inbox.collect", inbox_collect),
        Method(
            "events.subscribe",
            subscribe,
            (Param("events", (list,), False, None), Param("replay", _BOOL, False, True)),
            while_stopping=True,
        ),
        Method("events.unsubscribe", unsubscribe, while_stopping=True),
    ):
        table.add(method)
    return table
