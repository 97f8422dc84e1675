"""Checks of a recovered orchestrator against the model and the invariants.

After a crash during operation N and a recovery:

* every effect of operations 1..N-1 is present (nothing acknowledged is lost);
* operation N is all or nothing: the recovered state must equal the model
  without it or the model with it applied, never something in between;
* nothing else exists (nothing from later, nothing invented);
* the structural invariants hold (see :func:`check_invariants`).

Relaxations, each allowed only here and nowhere else:

* **The in-flight turn may be lost.** A turn whose ``turn.complete`` did not
  reach the disk is gone; the agent is told at its next turn.
* **Re-delivery.** Messages the lost turn had consumed are pending again, so
  they are delivered a second time. (In the model they never left the inbox,
  because consumption is acknowledged only with the turn.)
* **Operation N's outcome comes from the disk.** When N was a turn that
  committed, its effects are read from its ``turn.complete`` entry; the model
  cannot know them, since they were never acknowledged. They must be applied
  in full, and the response must still continue the acknowledged digest chain.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from oracle.errors import OracleViolation
from oracle.incremental import files_below, log_files, log_part
from oracle.log_start import deleted_range_problems
from oracle.model import Model, ModelAgent, ModelState, canonical
from oracle.reads import Memos, Reads, TurnView, log_facts
from substrat import events
from substrat.agents import USER, AgentState
from substrat.providers.chat_history import conversation_problems
from substrat.providers.scripted import chain_digest, reply_header
from substrat.session import SessionState

if TYPE_CHECKING:
    from faultfs import FaultFS
    from substrat.orchestrator import Orchestrator
    from substrat.providers.base import TurnRecord

_SHOWN = 6


@dataclass
class View:
    """A comparable picture of agents, conversations and inboxes."""

    agents: dict[str, tuple[str, str | None, str]] = field(default_factory=dict)
    turns: dict[str, list[TurnView]] = field(default_factory=dict)
    inboxes: dict[str, set[str]] = field(default_factory=dict)


def _turn_views(history: list[TurnRecord]) -> list[TurnView]:
    return [(t.prompt, t.response, canonical(t.transcript)) for t in history]


def observe(
    orch: Orchestrator,
    reads: Reads | None = None,
    *,
    memos: Memos | None = None,
    fs: FaultFS | None = None,
) -> View:
    """What the orchestrator shows: its tree, each conversation (``orch.history``), inboxes.

    With ``reads``, conversations come from its one read of each log. With
    ``memos`` (and the ``fs`` the root is on, None for the real disk), a
    conversation is derived again only when its log's bytes changed.
    """
    view = View()
    for node in orch.tree.walk():
        view.agents[node.agent_id] = (node.name, node.parent_id, node.instructions)

        def derive(agent_id: str = node.agent_id) -> list[TurnView]:
            if reads is not None:
                return _turn_views(reads.history(agent_id))
            return _turn_views(orch.history(agent_id))

        if memos is None:
            view.turns[node.agent_id] = derive()
        else:
            directory = log_files(orch.logs.path(node.session_id))
            if reads is None or reads.memos is None:
                files = log_part(files_below(fs, directory))
            else:
                files = reads.log_files(directory)
            view.turns[node.agent_id] = memos.turns.get(fs, directory, derive, files)
        view.inboxes[node.agent_id] = {
            m.message_id for m in orch.inboxes.inbox(node.agent_id).all()
        }
    view.inboxes[USER] = {m.message_id for m in orch.user_inbox()}
    return view


def expected(state: ModelState) -> View:
    view = View()
    for agent in state.agents.values():
        view.agents[agent.agent_id] = (agent.name, agent.parent_id, agent.instructions)
        view.turns[agent.agent_id] = list(agent.turns)
        view.inboxes[agent.agent_id] = set(state.inboxes.get(agent.agent_id, {}))
    view.inboxes[USER] = set(state.inboxes.get(USER, {}))
    return view


def diff(want: View, got: View, names: dict[str, str]) -> list[str]:
    """Human-readable differences; empty when the views agree."""
    out: list[str] = []

    def label(agent_id: str) -> str:
        return f"{names.get(agent_id, '?')} ({agent_id[:8]})"

    for agent_id in sorted(want.agents.keys() - got.agents.keys()):
        out.append(f"lost agent {label(agent_id)}")
    for agent_id in sorted(got.agents.keys() - want.agents.keys()):
        out.append(f"unexpected agent {label(agent_id)}")
    for agent_id in sorted(want.agents.keys() & got.agents.keys()):
        if want.agents[agent_id] != got.agents[agent_id]:
            out.append(
                f"agent {label(agent_id)}: expected {want.agents[agent_id]}, "
                f"found {got.agents[agent_id]}"
            )
        w, g = want.turns[agent_id], got.turns[agent_id]
        if w != g:
            at = next(
                (i for i, (a, b) in enumerate(zip(w, g, strict=False)) if a != b),
                min(len(w), len(g)),
            )
            out.append(
                f"conversation of {label(agent_id)}: expected {len(w)} turns, found {len(g)}; "
                f"first difference at turn {at + 1}: expected "
                f"{_short(w[at]) if at < len(w) else 'nothing'}, found "
                f"{_short(g[at]) if at < len(g) else 'nothing'}"
            )
    for endpoint in sorted(want.inboxes.keys() | got.inboxes.keys()):
        if endpoint != USER and endpoint not in want.agents.keys() & got.agents.keys():
            continue
        w_ids = want.inboxes.get(endpoint, set())
        g_ids = got.inboxes.get(endpoint, set())
        who = USER if endpoint == USER else label(endpoint)
        if w_ids - g_ids:
            out.append(f"inbox of {who}: lost messages {sorted(w_ids - g_ids)[:_SHOWN]}")
        if g_ids - w_ids:
            out.append(f"inbox of {who}: unexpected messages {sorted(g_ids - w_ids)[:_SHOWN]}")
    return out


def _short(turn: tuple[str, str, str]) -> str:
    prompt, response, _ = turn
    return (
        f"(prompt {prompt[:40]!r}, response {response.splitlines()[0][:40] if response else ''!r})"
    )


def _turn_effects(reads: Reads, agent_id: str, turn_id: str) -> dict[str, Any]:
    session_id = reads.orch.tree.get(agent_id).session_id
    for entry in reads.log(session_id).entries:
        data = entry.get("data") or {}
        if entry.get("event") == events.TURN_COMPLETE and data.get("turn_id") == turn_id:
            return dict(data.get("effects") or {})
    raise OracleViolation(f"turn {turn_id} of {agent_id} is in the history but not in the log")


def outcome_if_applied(
    model: Model, orch: Orchestrator, got: View, reads: Reads | None = None
) -> ModelState | None:
    """The model with the in-flight operation applied as the disk shows it, if it was."""
    op = model.inflight
    if op is None:
        return None
    state = model.state  # read only: each outcome below is built on a copy of it
    if op.kind == "create_root":
        agent_id = next(
            (
                a
                for a, (name, parent, _) in got.agents.items()
                if name == op.args["name"] and parent is None and a not in state.agents
            ),
            None,
        )
        if agent_id is None:
            return None
        state = model.copy_state()
        state.add_agent(
            ModelAgent(
                agent_id,
                op.args["name"],
                None,
                op.args.get("instructions", ""),
                op.args.get("provider", "scripted"),
            )
        )
        return state
    if op.kind == "turn":
        agent_id = op.args["agent_id"]
        agent = state.agents.get(agent_id)
        if agent is None or agent_id not in got.turns:
            return None
        history = (reads or Reads(orch)).history(agent_id)
        if len(history) != len(agent.turns) + 1:
            return None
        extra = history[-1]
        wanted_prompt = op.args.get("prompt")
        if wanted_prompt is not None and not extra.prompt.endswith(wanted_prompt):
            raise OracleViolation(
                f"the in-flight turn of {agent.name} committed with prompt {extra.prompt!r}, "
                f"but the prompt sent was {wanted_prompt!r}",
                trace=model.trace_lines(),
            )
        if agent.provider in ("scripted", "fake"):
            want = reply_header(len(agent.turns) + 1, chain_digest(agent.digest, extra.prompt))
            if not extra.response.startswith(want):
                raise OracleViolation(
                    f"the in-flight turn of {agent.name} committed a response that does not "
                    f"continue the acknowledged conversation (expected {want!r})",
                    trace=model.trace_lines(),
                )
        state = model.copy_state()
        state.apply_turn(
            agent_id,
            extra.prompt,
            extra.response,
            _turn_effects(reads or Reads(orch), agent_id, extra.turn_id),
            extra.transcript,
        )
        return state
    if op.kind == "terminate":
        if op.args["agent_id"] in state.agents and op.args["agent_id"] not in got.agents:
            state = model.copy_state()
            state.terminate(op.args["agent_id"])
            return state
        return None
    if op.kind == "ack_user":
        state = model.copy_state()
        for message_id in op.args["message_ids"]:
            state.inbox(USER).pop(message_id, None)
        return state
    return None  # evict and recover change nothing the model tracks


def check_recovery(
    model: Model, orch: Orchestrator, *, memos: Memos | None = None, fs: FaultFS | None = None
) -> ModelState:
    """Check a freshly recovered orchestrator; returns the outcome that matched.

    Raises :class:`OracleViolation` with the differences against each allowed
    outcome and the operation trace. ``memos`` and ``fs``: see :class:`Reads`.
    """
    reads = Reads(orch, memos, fs)
    got = observe(orch, reads, memos=memos, fs=fs)
    names = {a.agent_id: a.name for a in model.state.agents.values()}
    names.update({a: n for a, (n, _, _) in got.agents.items()})
    # The model's own state, not a copy: the checks only read a candidate, and
    # settling on this one leaves the model as it is.
    candidates: list[tuple[str, ModelState]] = [("without the in-flight operation", model.state)]
    applied = outcome_if_applied(model, orch, got, reads)
    if applied is not None:
        candidates.insert(0, ("with the in-flight operation applied", applied))
    reports = []
    for label, state in candidates:
        problems = diff(expected(state), got, names)
        if not problems:
            check_invariants(orch, state, reads)
            check_registry(model, orch, reads)
            check_checkpoints(model, orch)
            return state
        reports.append(f"against the model {label}:\n    " + "\n    ".join(problems))
    raise OracleViolation(
        "recovered state matches no allowed outcome\n  " + "\n  ".join(reports),
        trace=model.trace_lines(),
    )


def check_registry(model: Model, orch: Orchestrator, reads: Reads | None = None) -> None:
    """The root registry after a crash and a recovery.

    * Every root acknowledged before the crash was registered before the crash:
      recovery registers only the in-flight ``create_root``'s root (committed,
      not yet registered) and never an acknowledged one.
    * No registered root is reported lost (nothing here deletes a directory, so
      a registration must never run ahead of a durable creation).
    * After recovery every live root is registered and the registry reads clean.
    """
    problems: list[str] = []
    report = orch.recovery_report
    assert report is not None
    acked_roots = {a.agent_id for a in model.state.agents.values() if a.parent_id is None}
    for sid in report.roots_registered:
        node = orch.tree.by_session(sid)
        if node is not None and node.agent_id in acked_roots:
            problems.append(f"acknowledged root {node.name} was not registered before the crash")
    if report.lost_roots:
        problems.append(f"registered roots reported lost: {report.lost_roots[:_SHOWN]}")
    if report.registry_problem is not None:
        problems.append(f"the registry is unusable: {report.registry_problem}")
    registry = (reads or Reads(orch)).registry()
    if registry.damage:
        problems.append(f"the registry has damage after recovery: {registry.damage}")
    for node in orch.tree.roots():
        if node.session_id not in registry.roots:
            problems.append(f"live root {node.name} is not registered after recovery")
    if problems:
        raise OracleViolation(
            "root registry broken after recovery:\n  " + "\n  ".join(problems),
            trace=model.trace_lines(),
        )


def check_checkpoints(model: Model, orch: Orchestrator) -> None:
    """Checkpoints after a crash and a recovery: every one still agrees with its log.

    A crash never makes a correct checkpoint disagree with its log: a checkpoint
    covers only entries that were durable before it was written, sealing and
    archiving keep every byte, and deletion removes only what two durable
    checkpoints cover. So a rejected checkpoint after a crash means one was
    written ahead of what it covers (recovery then read that log in full, so the
    state can still be right: this check is what notices).
    """
    report = orch.recovery_report
    assert report is not None
    if report.checkpoints_rejected:
        raise OracleViolation(
            "checkpoints disagree with their logs after a crash (written before what they "
            f"cover was durable?): {dict(list(report.checkpoints_rejected.items())[:_SHOWN])}",
            trace=model.trace_lines(),
        )


def check_invariants(
    orch: Orchestrator, state: ModelState | None = None, reads: Reads | None = None
) -> None:
    """Structural invariants of a recovered root, on disk and in memory.

    No ACTIVE record; every record readable; live agents have live records and
    terminated ones TERMINATED records; the tree is consistent; every log reads
    clean (a valid JSONL prefix with strictly increasing seq); and each inbox
    equals enqueued minus delivered as the logs define it.
    """
    problems: list[str] = []
    reads = reads or Reads(orch)
    orch.tree.check()
    scan = reads.scan()
    bad = [q for q in scan.quarantined if q.kind != "bad_name"]
    if bad:
        problems.append(f"unreadable session records after a crash: {bad}")
    records = {s.session_id: s for s in scan.sessions}
    for session in scan.sessions:
        if session.state is SessionState.ACTIVE:
            problems.append(f"session {session.session_id} is ACTIVE after recovery")
    live_sessions = set()
    for node in orch.tree.walk():
        live_sessions.add(node.session_id)
        if node.state is AgentState.BUSY:
            problems.append(f"agent {node.name} is stuck BUSY after recovery")
        record = records.get(node.session_id)
        if record is None:
            problems.append(f"live agent {node.name} has no session record")
        elif record.state is SessionState.TERMINATED:
            problems.append(f"live agent {node.name} has a TERMINATED record")
    if state is not None:
        for session in scan.sessions:
            if (
                session.agent_id in state.terminated
                and session.state is not SessionState.TERMINATED
            ):
                problems.append(
                    f"terminated agent {session.agent_id[:8]} has a {session.state.value} record"
                )
    for node in orch.tree.walk():
        if node.provider == "openai":
            # what the endpoint would be sent next must be a valid conversation
            found = conversation_problems(node.instructions, reads.history(node.agent_id))
            if found:
                problems.append(f"conversation of {node.name} is not sendable: {found[:_SHOWN]}")
    endpoints = [(n.agent_id, n.session_id) for n in orch.tree.walk()]
    endpoints.append((USER, USER))
    compaction = orch.checkpointer.policy.compaction
    for endpoint, log_name in endpoints:
        read = reads.log(log_name)
        base = reads.base(log_name)
        if not read.damage.clean:
            problems.append(
                f"log of {endpoint[:8]} has damage after recovery: {read.damage.counts()}"
            )
        in_order, want = log_facts(reads, log_name, read, base)
        if not in_order:
            problems.append(f"log of {endpoint[:8]} has seqs out of order")
        who, path = f"log of {endpoint[:8]}", orch.logs.path(log_name)
        problems.extend(deleted_range_problems(who, read, base, path, compaction))
        problems.extend(reads.start_problems(who, log_name))
        have = (
            {m.message_id for m in orch.user_inbox()}
            if endpoint == USER
            else {m.message_id for m in orch.inboxes.inbox(endpoint).all()}
        )
        if want != have:
            problems.append(
                f"inbox of {endpoint[:8]} is not enqueued minus delivered: "
                f"missing {sorted(want - have)[:_SHOWN]}, extra {sorted(have - want)[:_SHOWN]}"
            )
    if problems:
        raise OracleViolation("invariants broken after recovery:\n  " + "\n  ".join(problems))
