"""The crash-recovery fuzzer: a Hypothesis state machine over the real orchestrator.

Rules drive the unmodified orchestrator on a faultfs disk: roots, children,
turns, messages both ways, broadcasts, inbox reads, terminations, evictions,
the wake loop and the user's inbox. ``crash_and_recover`` draws an operation,
the I/O boundary inside it where the crash lands, the crash mode and image,
and sometimes a second crash inside recovery itself; then it recovers and
checks the result against the shadow model. ``fsync_failure_and_crash`` makes
one or more consecutive fsyncs inside an operation fail (EIO, the pages
dropped or written back anyway): an operation reported as failed must never
come back, one reported undecided may. Two targeted rules crash where random
steps rarely get: a turn reading an inbox that was just sent to, and a
termination that cascades over a grandchild. After every step the in-memory
state must equal the model's.

Use it from a test module::

    from oracle.machines import CrashRecoveryMachine
    TestCrashRecovery = CrashRecoveryMachine.TestCase
"""

from __future__ import annotations

from typing import Any

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from faultfs import MODES
from oracle.checks import diff, expected, observe
from oracle.errors import OracleViolation
from oracle.harness import CrashHarness, scripted_registry
from oracle.workload import STEP_KINDS, Step
from substrat.providers.registry import ProviderRegistry

NAMES = ("ada", "bob", "cy", "dee", "eve")
"""Five names, so collisions among siblings happen often."""
MAX_BOUNDARY = 48
MAX_RECOVERY_BOUNDARY = 40
MAX_FSYNC = 24
"""Operations make up to about this many fsyncs; a later one never fails."""
MAX_CONSECUTIVE_FAILURES = 3


class CrashRecoveryMachine(RuleBasedStateMachine):
    """Subclass and set ``profile``, ``slots``, ``provider`` or ``make_registry``."""

    profile = "posix"
    slots = 2
    provider = "scripted"

    def make_registry(self) -> ProviderRegistry:
        return scripted_registry()

    def __init__(self) -> None:
        super().__init__()
        self.harness = CrashHarness(
            profile=self.profile,
            slots=self.slots,
            registry=self.make_registry,
            provider=self.provider,
        )
        self.crashes = 0

    def teardown(self) -> None:
        self.harness.close()

    # -- helpers -------------------------------------------------------------

    def _paths(self) -> list[str]:
        state = self.harness.model.state
        return sorted(state.path(a) for a in state.agents)

    def _leaves(self) -> list[str]:
        state = self.harness.model.state
        return sorted(state.path(a.agent_id) for a in state.agents.values() if not a.children)

    def _has_agents(self) -> bool:
        return bool(self.harness.model.state.agents)

    def _draw_step(self, data: Any) -> Step:
        paths = self._paths()
        if not paths:
            return Step("create_root", data.draw(st.sampled_from(NAMES), label="name"))
        kind = data.draw(st.sampled_from(STEP_KINDS), label="operation")
        agent = data.draw(st.sampled_from(paths), label="agent")
        if kind == "create_root":
            return Step(kind, data.draw(st.sampled_from(NAMES), label="name"))
        if kind == "spawn":
            return Step(kind, agent, data.draw(st.sampled_from(NAMES), label="child"))
        if kind in ("send", "ask"):
            return Step(kind, agent, data.draw(st.sampled_from([*paths, "user"]), label="to"))
        if kind == "terminate_by_parent":
            return Step(kind, agent, data.draw(st.sampled_from(NAMES), label="child"))
        return Step(kind, agent)

    def _step(self, step: Step) -> None:
        self.harness.run(step)

    # -- rules -----------------------------------------------------------------

    @initialize(name=st.sampled_from(NAMES))
    def first_root(self, name: str) -> None:
        self._step(Step("create_root", name))

    @rule(name=st.sampled_from(NAMES))
    def create_root(self, name: str) -> None:
        self._step(Step("create_root", name))

    @precondition(_has_agents)
    @rule(data=st.data(), name=st.sampled_from(NAMES))
    def spawn_child(self, data: Any, name: str) -> None:
        self._step(Step("spawn", data.draw(st.sampled_from(self._paths())), name))

    @precondition(_has_agents)
    @rule(data=st.data(), ask=st.booleans())
    def send_message(self, data: Any, ask: bool) -> None:
        paths = self._paths()
        src = data.draw(st.sampled_from(paths), label="from")
        dst = data.draw(st.sampled_from([*paths, "user"]), label="to")
        self._step(Step("ask" if ask else "send", src, dst))

    @precondition(_has_agents)
    @rule(data=st.data())
    def broadcast(self, data: Any) -> None:
        self._step(Step("broadcast", data.draw(st.sampled_from(self._paths()))))

    @precondition(_has_agents)
    @rule(data=st.data())
    def check_inbox(self, data: Any) -> None:
        self._step(Step("inbox", data.draw(st.sampled_from(self._paths()))))

    @precondition(_has_agents)
    @rule(data=st.data())
    def run_turn(self, data: Any) -> None:
        kind = data.draw(st.sampled_from(("turn", "complete")))
        self._step(Step(kind, data.draw(st.sampled_from(self._paths()))))

    @precondition(_has_agents)
    @rule(data=st.data())
    def terminate_leaf(self, data: Any) -> None:
        self._step(Step("terminate", data.draw(st.sampled_from(self._leaves()))))

    @precondition(_has_agents)
    @rule(data=st.data())
    def eviction(self, data: Any) -> None:
        self._step(Step("evict", data.draw(st.sampled_from(self._paths()))))

    @precondition(_has_agents)
    @rule()
    def wake_loop(self) -> None:
        self._step(Step("pending"))

    @precondition(_has_agents)
    @rule()
    def read_user_inbox(self) -> None:
        self._step(Step("user_inbox"))

    @rule(data=st.data())
    def crash_and_recover(self, data: Any) -> None:
        step = self._draw_step(data)
        boundary = data.draw(st.integers(1, MAX_BOUNDARY), label="boundary")
        mode = data.draw(st.sampled_from(MODES), label="mode")
        seed = data.draw(st.integers(0, 7), label="image seed")
        recovery_crash = data.draw(
            st.none() | st.integers(1, MAX_RECOVERY_BOUNDARY), label="crash inside recovery at"
        )
        ran = self.harness.run(step, crash_at=boundary)
        cycle = self.harness.crash_and_recover(mode, seed, recovery_crash_at=recovery_crash)
        self.crashes += 1
        event(f"crash mode: {mode}")
        event("crash inside the operation" if ran.crashed else "crash after the operation")
        if cycle.recovery_crashed:
            event("recovery itself crashed")

    @rule(data=st.data())
    def fsync_failure_and_crash(self, data: Any) -> None:
        step = self._draw_step(data)
        nth = data.draw(st.integers(1, MAX_FSYNC), label="failing fsync")
        count = data.draw(st.integers(1, MAX_CONSECUTIVE_FAILURES), label="failures in a row")
        written = data.draw(st.booleans(), label="written back anyway")
        mode = data.draw(st.sampled_from(MODES), label="mode")
        seed = data.draw(st.integers(0, 7), label="image seed")
        outcome = self.harness.run_failing_fsyncs(step, nth, count, written=written)
        self.harness.crash_and_recover(mode, seed)
        self.crashes += 1
        event(f"after EIO: {outcome}")

    @precondition(_has_agents)
    @rule(data=st.data())
    def send_then_crash_reading_the_inbox(self, data: Any) -> None:
        """A message sent, then its reader's ``@inbox`` turn cut: nothing consumed
        before the commit may count as delivered."""
        paths = self._paths()
        src = data.draw(st.sampled_from(paths), label="from")
        dst = data.draw(st.sampled_from([p for p in paths if p != src] or paths), label="to")
        self._step(Step("send", src, dst))
        if dst == src:
            return
        self._crash_during(Step("inbox", dst), data)

    @precondition(_has_agents)
    @rule(data=st.data(), child=st.sampled_from(NAMES), grandchild=st.sampled_from(NAMES))
    def crash_in_a_cascading_termination(self, data: Any, child: str, grandchild: str) -> None:
        """A parent terminates a child that has a child of its own, and the crash cuts
        the cascade: recovery must finish it."""
        parent = data.draw(st.sampled_from(self._paths()), label="parent")
        self._step(Step("spawn", parent, child))
        self._step(Step("spawn", f"{parent}/{child}", grandchild))
        self._crash_during(Step("terminate_by_parent", parent, child), data)

    def _crash_during(self, step: Step, data: Any) -> None:
        boundary = data.draw(st.integers(1, MAX_BOUNDARY), label="boundary")
        mode = data.draw(st.sampled_from(MODES), label="mode")
        seed = data.draw(st.integers(0, 7), label="image seed")
        ran = self.harness.run(step, crash_at=boundary)
        self.harness.crash_and_recover(mode, seed)
        self.crashes += 1
        event("targeted crash inside" if ran.crashed else "targeted crash after")

    # -- invariants ----------------------------------------------------------------

    @invariant()
    def matches_the_model(self) -> None:
        harness = self.harness
        with harness.fs:
            got = observe(harness.orch)
        names = {a.agent_id: a.name for a in harness.model.state.agents.values()}
        problems = diff(expected(harness.model.state), got, names)
        if problems:
            raise OracleViolation(
                "running state differs from the model:\n  " + "\n  ".join(problems),
                trace=harness.model.trace_lines(),
            )
        harness.orch.tree.check()
        for node in harness.orch.tree.walk():
            assert node.state.value != "busy", f"{node.name} is stuck BUSY between steps"
