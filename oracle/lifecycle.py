"""The lifecycle fuzzer: random sequences of orchestrator operations against a shadow model.

Operations: create_root, spawn_child, run_turn, send_message (notification or
request, to an agent, the parent or the user), broadcast, terminate_leaf,
terminate_cascade, run_pending (the wake loop, then maybe the user collects
its inbox), evict, and reopen (a clean close, or a kill while idle, then a
recovering open). Names come from a five-name alphabet, so collisions are
frequent; the multiplexer has three slots, so sessions are evicted and
restored all the time.

The machine has one rule, ``step``: it draws one of the operations valid in
the current state (what were rules' preconditions; the first step creates
the first root, as an initial rule did) and that operation's arguments, then
runs it. The engine's cost per rule and precondition was most of its cost per
step. A counterexample shows each step as the call it made, e.g.
``state.spawn_child(parent=ada, name='bo')`` (agents by their path of
names), and the shrinker deletes the steps a failure does not need.

The shadow model predicts everything the orchestrator must show: the tree,
every inbox in order (sender and kind), who waits for which reply, how many
turns each agent has had (the wake loop is simulated message by message), and
the user's inbox. After every step the checks compare the two and check the
orchestrator's own registries (sessions, inboxes, tool contexts, turn
counters, live sessions, open logs) against the tree; no agent may be left
BUSY and nothing may be in use between steps. Each provider conversation must
chain the digest of every prompt in its log, which fails if an eviction or a
restart resumed a session from the wrong state.

Where the root lives: :class:`LifecycleMachine` runs on a :class:`faultfs.FaultFS`
disk (what a process sees; crashes here are kills while idle, which keep the
page cache, so nothing needs real fsyncs), and :class:`OnDiskLifecycleMachine`
on a real temporary directory with real fsyncs, so real I/O stays covered; a
test module runs a few examples of the second per run. Ids are deterministic
and the clock monotonic. Besides the ``reopen`` operation every example ends
with a restart (a kill while idle, then a recovering open) whose result must
match the shadow too.

Use it from a test module::

    from oracle.lifecycle import LifecycleMachine
    TestLifecycle = LifecycleMachine.TestCase
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import shutil
import sys
import tempfile
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from hypothesis import strategies as st
from hypothesis.control import should_note
from hypothesis.stateful import RuleBasedStateMachine, rule

from faultfs import FaultFS
from oracle.conversations import Conversations
from oracle.draws import flag, pick
from oracle.incremental import files_below, log_files, log_part
from oracle.kill import abandon
from substrat.agents import USER, AgentState
from substrat.errors import HasChildrenError, NameCollisionError
from substrat.orchestrator import Orchestrator
from substrat.providers.registry import ProviderRegistry
from substrat.providers.scripted import ScriptedProvider
from substrat.words import plural

T = TypeVar("T")
NAMES = ("ada", "bo", "cy", "di", "ed")
SLOTS = 3
MAX_AGENTS = 14  # keeps one example well under a second
FAULTFS_ROOT = "/substrat-lifecycle"
TARGETS = ("parent", USER)
TEXTS = ("hello", "status?", "plan the work")
MAX_TURNS = (1, 3, 1000)
EVERY_AGENT_OPERATION = (
    "run_turn",
    "send_message",
    "broadcast",
    "terminate_leaf",  # a tree always has a leaf
    "run_pending",
    "evict",
    "reopen",
)
"""The operations valid whenever there is an agent, in the order a shrink prefers."""


@dataclass
class Msg:
    order: int
    sender: str
    kind: str
    request: int | None = None  # for a request: its own key, so the reply can clear it


@dataclass
class Agent:
    agent_id: str
    name: str
    parent: str | None
    children: dict[str, str] = field(default_factory=dict)
    inbox: list[Msg] = field(default_factory=list)
    waiting: dict[int, str] = field(default_factory=dict)  # request key -> recipient id
    turns: int = 0


def _registry() -> ProviderRegistry:
    # The scripted provider only: the default registry also scans every installed
    # package's entry points, which took a fifth of this fuzzer's CPU time.
    registry = ProviderRegistry()
    registry.register("scripted", ScriptedProvider)
    return registry


def _pick(data: st.DataObject, items: Sequence[T], label: str) -> T:
    # quiet: a counterexample shows each step as the call it made (see ``step``)
    return pick(data, items, label, quiet=True)


def _flag(data: st.DataObject, label: str) -> bool:
    return flag(data, label, quiet=True)


def _raises(kind: type[BaseException], call: Callable[[], object]) -> None:
    try:
        call()
    except kind:
        return
    raise AssertionError(f"expected {kind.__name__}")


class LifecycleMachine(RuleBasedStateMachine):
    """The lifecycle fuzzer on a faultfs disk (see the module docstring)."""

    on_disk = False

    def __init__(self) -> None:
        super().__init__()
        self.fs: FaultFS | None = None
        if self.on_disk:
            self.dir = Path(tempfile.mkdtemp(prefix="substrat-lifecycle-"))
        else:
            # Active for the whole example: activating a FaultFS patches every
            # intercepted function, which costs more than many steps do.
            self.fs = FaultFS(FAULTFS_ROOT, record_trace=False, durable_state=False)
            self.dir = Path(FAULTFS_ROOT)
            self.fs.__enter__()
        self.loop = asyncio.new_event_loop()
        self._ids = itertools.count(1)
        self._ticks = itertools.count(1)
        self.order = itertools.count()
        self.agents: dict[str, Agent] = {}
        self.roots: dict[str, str] = {}
        self.roots_made = False
        self.user: list[Msg] = []
        # An agent's log is checked again only when its files changed, from what it
        # appended when only that changed (oracle.conversations).
        self.conversations = Conversations()
        # What the last conversation check saw (see conversations_are_whole): the disk's
        # model and clock, and per agent its session and turns; and each session's log
        # directory (the orchestrator's own path for it, asked again after a reopen).
        self._disk_checked: tuple[object, int] | None = None
        self._conversation_checked: dict[str, tuple[str, int]] = {}
        self._log_dirs: dict[str, str] = {}
        try:
            self.orch = self.run(self.open())
            self.check_all()  # what the engine's first invariant check did
        except BaseException:
            self._release()
            raise

    # -- plumbing ---------------------------------------------------------------

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def new_id(self) -> str:
        return f"{next(self._ids):032x}"

    def clock(self) -> str:
        # strictly increasing, so arrival order survives a restart exactly
        tick = next(self._ticks)
        minutes, micros = divmod(tick, 60_000_000)
        return f"2030-01-01T{minutes // 60:02d}:{minutes % 60:02d}:{micros / 1e6:09.6f}+00:00"

    async def open(self) -> Orchestrator:
        return await Orchestrator.open(
            self.dir / "root",
            registry=_registry(),
            slots=SLOTS,
            new_id=self.new_id,
            clock=self.clock,
        )

    def teardown(self) -> None:
        try:
            # Every example ends with a restart that must give back exactly the same state,
            # unless a step already failed (teardown runs in Hypothesis's ``finally``; a
            # second error there would hide the first and make the failure look flaky).
            if sys.exc_info()[0] is not None:
                return
            # A kill, not a clean close: the teardown's clean close (suspending every live
            # session, writing the start summary) was half of the fuzzer's clean closes,
            # while the reopen steps close cleanly and kill as often as the engine draws
            # them; a kill is the restart whose open must recover everything.
            self.reopen(crash=True)
            self.check_all(full=True)
        finally:
            # No clean close after the check either: nothing would look at its result.
            abandon(self.orch)
            self._release()

    def _release(self) -> None:
        self.loop.close()
        if self.fs is not None:
            self.fs.__exit__()
        else:
            shutil.rmtree(self.dir, ignore_errors=True)

    def depth(self, agent_id: str) -> int:
        parent = self.agents[agent_id].parent
        return 0 if parent is None else 1 + self.depth(parent)

    def alive(self) -> list[str]:
        # Deepest, then newest first: Hypothesis favours the first elements of a list,
        # and children (with parents that outlive them) are where the interesting cases are.
        return sorted(self.agents, key=lambda a: (-self.depth(a), -int(a, 16)))

    def deliver(self, recipient: str, sender: str, kind: str, request: int | None = None) -> Msg:
        msg = Msg(next(self.order), sender, kind, request)
        if recipient == USER:
            self.user.append(msg)
        elif recipient in self.agents:
            self.agents[recipient].inbox.append(msg)
        return msg

    def turn(self, agent_id: str, prompt: str) -> Any:
        result = self.run(self.orch.run_turn(agent_id, prompt))
        self.agents[agent_id].turns += 1
        assert result.response.startswith(f"#{self.agents[agent_id].turns} ")
        return result

    def forget(self, agent_id: str) -> None:
        gone = self.agents.pop(agent_id)
        if gone.parent is None:
            del self.roots[gone.name]
        elif gone.parent in self.agents:
            del self.agents[gone.parent].children[gone.name]
        for other in self.agents.values():
            for key in [k for k, r in other.waiting.items() if r == agent_id]:
                del other.waiting[key]

    def path(self, agent_id: str) -> str:
        """An agent as a reader of a counterexample knows it: its names from the root."""
        agent = self.agents[agent_id]
        return agent.name if agent.parent is None else f"{self.path(agent.parent)}/{agent.name}"

    # -- the one rule -----------------------------------------------------------------

    def operations(self) -> list[str]:
        """The operations valid in this state (what were the rules' preconditions)."""
        if not self.agents:
            # the first step creates the first root, as an initial rule did
            return ["create_root", "run_pending", "reopen"] if self.roots_made else ["create_root"]
        ops = list(EVERY_AGENT_OPERATION)
        if len(self.agents) < MAX_AGENTS:
            ops[1:1] = ["create_root", "spawn_child"]
        if any(a.children for a in self.agents.values()):
            ops.append("terminate_cascade")
        return ops

    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        """One operation, drawn among those valid now, with its arguments.

        One rule with the choices drawn inside, not a rule per operation: the
        engine's cost per rule and precondition was most of its cost per step
        (docs/benchmarks.md, "Twelfth pass: the lifecycle fuzzer"). A
        counterexample still shows each operation as a call with its
        arguments (_repr_step below), and an operation the failure does not need
        is a step the shrinker deletes.
        """
        name = _pick(data, self.operations(), "operation")
        arguments = getattr(self, f"draw_{name}")(data)
        if self._noting is None:
            # Asked once an example: whether this run prints its steps (the replay of a
            # counterexample, or a verbose run) holds for the whole example.
            self._noting = should_note()
        if self._noting:  # the replay that prints the counterexample: see _repr_step
            shown = ", ".join(
                f"{k}={self.path(v) if v in self.agents else v!r}" for k, v in arguments.items()
            )
            self._shown = f"state.{name}({shown})"
        getattr(self, name)(**arguments)
        # The checks after every step, here and not an @invariant: the engine's call of
        # an invariant (its preconditions, verbosity and timing) cost a tenth of them.
        self.check_all()

    _shown: str | None = None
    _noting: bool | None = None

    def _repr_step(self, rule: Any, data: Any, result: Any) -> str:
        """The step as the call it made, where Hypothesis prints ``state.step(data=data(...))``.

        Hypothesis's own hook for a step's line (private: a Hypothesis that renames
        it prints its line again, and test_lifecycle_machine fails on it).
        """
        shown, self._shown = self._shown, None
        return shown or super()._repr_step(rule, data, result)

    def draw_create_root(self, data: st.DataObject) -> dict[str, Any]:
        return {"name": _pick(data, NAMES, "name")}

    def draw_spawn_child(self, data: st.DataObject) -> dict[str, Any]:
        return {"parent": _pick(data, self.alive(), "parent"), "name": _pick(data, NAMES, "name")}

    def draw_run_turn(self, data: st.DataObject) -> dict[str, Any]:
        return {"agent": _pick(data, self.alive(), "agent"), "text": _pick(data, TEXTS, "text")}

    def draw_send_message(self, data: st.DataObject) -> dict[str, Any]:
        alive = self.alive()
        sender = _pick(data, alive, "sender")
        return {
            "sender": sender,
            "target": _pick(data, [*TARGETS, *alive], "target"),
            "ask": _flag(data, "ask"),
        }

    def draw_broadcast(self, data: st.DataObject) -> dict[str, Any]:
        return {"sender": _pick(data, self.alive(), "sender")}

    def draw_terminate_leaf(self, data: st.DataObject) -> dict[str, Any]:
        leaves = [a for a in self.alive() if not self.agents[a].children]
        return {"leaf": _pick(data, leaves, "leaf")}

    def draw_terminate_cascade(self, data: st.DataObject) -> dict[str, Any]:
        tops = [a for a in self.alive() if self.agents[a].children]
        return {"top": _pick(data, tops, "top")}

    def draw_run_pending(self, data: st.DataObject) -> dict[str, Any]:
        return {"max_turns": _pick(data, MAX_TURNS, "max_turns"), "ack": _flag(data, "ack")}

    def draw_evict(self, data: st.DataObject) -> dict[str, Any]:
        return {"agent": _pick(data, self.alive(), "agent")}

    def draw_reopen(self, data: st.DataObject) -> dict[str, Any]:
        return {"crash": _flag(data, "crash")}

    # -- the operations ------------------------------------------------------------------

    def create_root(self, name: str) -> None:
        if name in self.roots:
            _raises(NameCollisionError, lambda: self.run(self.orch.create_root(name)))
            return
        info = self.run(self.orch.create_root(name))
        self.roots_made = True
        self.agents[info.agent_id] = Agent(info.agent_id, name, None)
        self.roots[name] = info.agent_id

    def spawn_child(self, parent: str, name: str) -> None:
        result = self.turn(parent, f"@spawn {name} be useful")
        if name in self.agents[parent].children:
            assert result.spawned == [] and "already have a child" in result.response
            return
        (child,) = result.spawned
        self.agents[child] = Agent(child, name, parent)
        self.agents[parent].children[name] = child

    def run_turn(self, agent: str, text: str) -> None:
        self.turn(agent, text)

    def send_message(self, sender: str, target: str, ask: bool) -> None:
        recipient = (self.agents[sender].parent or USER) if target == "parent" else target
        result = self.turn(sender, f"@{'ask' if ask else 'send'} {target} hello")
        if recipient == sender:
            assert "cannot message itself" in result.response and not result.messages_sent
            return
        assert len(result.messages_sent) == 1
        kind = "request" if ask else "notification"
        msg = self.deliver(recipient, sender, kind)
        if ask:
            msg.request = msg.order
            if recipient != USER:
                self.agents[sender].waiting[msg.order] = recipient

    def broadcast(self, sender: str) -> None:
        parent = self.agents[sender].parent
        # a root broadcasts to its children, a child to its siblings
        group = self.agents[sender if parent is None else parent].children
        targets = [group[n] for n in sorted(group) if group[n] != sender]
        result = self.turn(sender, "@broadcast news")
        assert f"broadcast to {plural(len(targets), 'agent')}" in result.response
        for target in targets:
            self.deliver(target, sender, "broadcast")

    def terminate_leaf(self, leaf: str) -> None:
        assert self.run(self.orch.terminate(leaf)) == [leaf]
        self.forget(leaf)

    def terminate_cascade(self, top: str) -> None:
        _raises(HasChildrenError, lambda: self.run(self.orch.terminate(top)))
        order: list[str] = []

        def leaves_first(agent_id: str) -> None:
            children = self.agents[agent_id].children
            for name in sorted(children):
                leaves_first(children[name])
            order.append(agent_id)

        leaves_first(top)
        assert self.run(self.orch.terminate(top, cascade=True)) == order
        for agent_id in order:
            self.forget(agent_id)

    def run_pending(self, max_turns: int, ack: bool) -> None:
        expected = 0
        while expected < max_turns:
            waiting = [a for a in self.agents.values() if a.inbox]
            if not waiting:
                break
            agent = min(waiting, key=lambda a: a.inbox[0].order)
            consumed, agent.inbox = agent.inbox, []
            agent.turns += 1
            expected += 1
            for msg in consumed:
                if msg.kind == "request" and msg.sender in self.agents:
                    self.deliver(msg.sender, agent.agent_id, "reply")
                    self.agents[msg.sender].waiting.pop(msg.order, None)
        assert self.run(self.orch.run_pending(max_turns=max_turns)) == expected
        if ack:  # the user collects (and acknowledges) everything sent to it
            got = self.run(self.orch.collect_user_inbox())
            assert [(m.sender, m.kind) for m in got] == [(m.sender, m.kind) for m in self.user]
            self.user = []

    def evict(self, agent: str) -> None:
        live = self.orch.mux.is_live(agent)
        assert self.run(self.orch.evict(agent)) is live
        assert not self.orch.mux.is_live(agent)

    def reopen(self, crash: bool = False) -> None:
        """Restart: a clean close, or a kill while idle (nothing is in flight either way).

        A kill keeps what the process wrote (the page cache survives it), so on
        faultfs as on a real disk it only closes the descriptors.
        """
        if crash:
            abandon(self.orch)  # closes the descriptors only, as a kill would
        else:
            self.run(self.orch.close())
        self.orch = self.run(self.open())
        self._log_dirs = {}
        report = self.orch.recovery_report
        assert report is not None
        assert report.agents == len(self.agents) and report.roots == len(self.roots)
        assert report.lost_turns == [] and report.reconciled == [] and report.cascaded == []
        assert report.orphans_terminated == [] and report.quarantined == []

    # -- checks -----------------------------------------------------------------------

    def check_all(self, full: bool = False) -> None:
        """Every check, in order (after every step, at its end: see ``step``).

        ``full``: every conversation rebuilt by ``Orchestrator.history`` (the teardown's).

        One walk of the live agents feeds all of them: ``Orchestrator.agents`` (the
        query ``substrat agent list`` shows), whose infos carry each agent's session,
        name, parent and children; then one pass over the shadow's agents with one
        tree lookup each for its state, inbox and conversation. Each check used to
        walk or look up the tree again for the same answers."""
        infos = self.orch.agents()
        by_id = {info.agent_id: info for info in infos}
        assert len(by_id) == len(infos), "an agent walked twice"
        self.registries_in_sync(by_id)
        self.tree_matches_the_shadow(by_id)
        sessions = self.agents_match_the_shadow()
        self.conversations_are_whole(full, sessions)

    def registries_in_sync(self, infos: dict[str, Any]) -> None:
        orch = self.orch
        ids = infos.keys()
        sessions = {info.session_id for info in infos.values()}
        assert ids == self.agents.keys()
        assert orch.sessions.keys() == sessions
        assert ids | {USER} >= set(orch.inboxes.endpoints())
        assert ids >= orch._contexts.keys()
        assert orch.turn_counts.keys() == ids
        assert ids >= orch.last_complete_seq.keys()
        pools = orch.mux._pools.values()
        assert all(p.keys() <= ids and len(p) <= SLOTS for p in pools)
        assert orch.logs._open.keys() <= sessions | {USER}

    def tree_matches_the_shadow(self, infos: dict[str, Any]) -> None:
        orch = self.orch
        orch.tree.check()
        assert {n.name: n.agent_id for n in orch.tree.roots()} == self.roots
        # The walk (``agents``) shows exactly the shadow's agents, each with the shadow's
        # name, parent and children. That is all the older per-agent checks asked: a
        # child's name in its parent's map is the child's own name (the shadow keeps it
        # so), and an agent is once among its parent's children (the shadow's lists
        # hold distinct ids).
        real = {i.agent_id: (i.name, i.parent_id, sorted(i.children)) for i in infos.values()}
        shadow = {
            a.agent_id: (a.name, a.parent, sorted(a.children.values()))
            for a in self.agents.values()
        }
        if real != shadow:  # (name, parent, children) of each agent that differs
            differ = sorted(k for k in real.keys() | shadow.keys() if real.get(k) != shadow.get(k))
            raise AssertionError([(k, real.get(k), shadow.get(k)) for k in differ])

    def agents_match_the_shadow(self) -> dict[str, str]:
        """No agent BUSY or in use between steps; each agent's state, waits and inbox
        are the shadow's; the user's inbox too. Returns each agent's session id."""
        orch = self.orch
        assert orch.busy_turns == 0 and not orch.mux._in_use
        get = orch.tree.get
        inboxes = orch.inboxes
        sessions: dict[str, str] = {}
        for agent_id, agent in self.agents.items():
            node = get(agent_id)
            sessions[agent_id] = node.session_id
            expected = AgentState.WAITING if agent.waiting else AgentState.IDLE
            assert node.state is expected, (agent.name, node.state, agent.waiting)
            assert sorted(node.waiting_on.values()) == sorted(agent.waiting.values())
            inbox = inboxes.inbox(agent_id)
            real = inbox.all()
            assert [(m.sender, m.kind) for m in real] == [(m.sender, m.kind) for m in agent.inbox]
            assert inbox.pending() == real  # nothing left claimed
        assert [(m.sender, m.kind) for m in orch.user_inbox()] == [
            (m.sender, m.kind) for m in self.user
        ]
        return sessions

    def conversations_are_whole(
        self, full: bool = False, sessions: dict[str, str] | None = None
    ) -> None:
        """Each conversation chains its prompts and has the shadow's turns (see
        :mod:`oracle.conversations`: re-derived where the log changed). ``sessions``:
        each agent's session id, as the tree gives it now (looked up if None)."""
        orch = self.orch
        fs = self.fs
        # Nothing on the disk changed since the last check (faultfs's clock moves with
        # every change of names or bytes; a restore would swap the model): each log has
        # the bytes it had then, and the conversation check is a function of those bytes,
        # the agent's session and the shadow's turns. An agent with the same session and
        # the same shadow turns as at its last check would get the same answer, so it is
        # not asked again (a sixth of the steps write nothing: a wake loop with no mail,
        # an eviction of a suspended agent, a name collision). The full rebuilds stay:
        # the teardown's is forced, and the periodic one counts only the lookups made.
        now = None if fs is None or full else (fs.model, fs.model.clock)
        unchanged = now is not None and now == self._disk_checked
        checked = self._conversation_checked
        dirs = self._log_dirs
        for agent in self.agents.values():
            agent_id = agent.agent_id
            session = orch.tree.get(agent_id).session_id if sessions is None else sessions[agent_id]
            if unchanged and checked.get(agent_id) == (session, agent.turns):
                continue
            log = dirs.get(session)
            if log is None:
                log = dirs[session] = log_files(orch.logs.path(session))
            history = functools.partial(orch.history, agent_id)
            files = log_part(files_below(fs, log))
            turns = self.conversations.count(log, files, history, force_full=full)
            assert turns == agent.turns, (agent.name, turns, agent.turns)
            checked[agent_id] = (session, turns)
        self._disk_checked = now


class OnDiskLifecycleMachine(LifecycleMachine):
    """The same fuzzer on a real temporary directory, with real fsyncs."""

    on_disk = True
