"""The crash-recovery fuzzer: a Hypothesis state machine over the real orchestrator.

Rules drive the unmodified orchestrator on a faultfs disk: roots, children,
turns, messages both ways, broadcasts, inbox reads, terminations (by the user
and by a parent's turn), evictions, the wake loop and the user's inbox. Every
operation takes a drawn :class:`CrashPlan` or None: with a plan, the operation
runs with a crash armed at the plan's I/O boundary inside it (or just after
it, when it has fewer), the disk is taken in the plan's crash mode and image,
recovery sometimes crashes too, and the recovered orchestrator is checked
against the shadow model. ``fsync_failure_and_crash`` makes one or more
consecutive fsyncs inside an operation fail (EIO, the pages dropped or
written back anyway): an operation reported as failed must never come back,
one reported undecided may. Two targeted rules crash where random steps
rarely get: a turn reading an inbox that was just sent to, and a termination
that cascades over a grandchild. After every operation that did not crash,
the running state must equal the model's (re-reading only the logs the
operation changed, see :mod:`oracle.incremental`); after one that crashed,
recovery's check already compared the whole recovered state.

Use it from a test module::

    from oracle.machines import CrashRecoveryMachine
    TestCrashRecovery = CrashRecoveryMachine.TestCase
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Any

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.control import should_note
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from hypothesis.strategies import SearchStrategy

from faultfs import MODES
from oracle.draws import ENGINE_CHOICES, flag, integer, pick
from oracle.eio_targets import USER_ENDPOINT, draw_target
from oracle.harness import CrashHarness, held_interception, scripted_registry
from oracle.refused import OUTCOMES_GOING_ON, check_after_eio
from oracle.workload import STEP_KINDS, Step
from substrat.agents import USER
from substrat.checkpointer import CheckpointPolicy
from substrat.errors import SubstratError
from substrat.providers.registry import ProviderRegistry

NAMES = ("ada", "bob", "cy", "dee", "eve")
"""Five names, so collisions among siblings happen often."""
MAX_BOUNDARY = 48
MAX_RECOVERY_BOUNDARY = 40
MAX_FSYNC = 24
"""Operations make up to about this many fsyncs; a later one never fails."""
MAX_CONSECUTIVE_FAILURES = 3
IMAGE_SEEDS = 8


@dataclass(frozen=True)
class CrashPlan:
    """How one operation crashes: where, in which mode, and whether recovery crashes too.

    ``boundary`` counts I/O boundaries from the operation's start (past its
    last one, the crash lands right after it); ``seed`` picks the image among
    the mode's; ``recovery_crash`` is the boundary inside recovery where a
    power loss hits before the recovery that is checked (past recovery's last
    boundary, recovery finishes and is itself the one checked; see
    :meth:`oracle.harness.CrashHarness.crash_and_recover`).
    """

    boundary: int
    mode: str
    seed: int = 0
    recovery_crash: int | None = None


class _MaybeCrash(SearchStrategy[CrashPlan | None]):
    """None or a :class:`CrashPlan`, in one span of plain integer choices.

    The values and their order are those of ``st.none() | st.builds(CrashPlan,
    boundary=st.integers(1, MAX_BOUNDARY), mode=st.sampled_from(MODES), seed=...,
    recovery_crash=st.none() | st.integers(1, MAX_RECOVERY_BOUNDARY))``, each
    uniform as there, and each shrinks the same way (to no crash, no recovery
    crash, the first boundary, mode and seed). Built of those strategies, the
    draw opened a span for each one of them (eleven for a plan); a rule draws
    this at nearly every step, and the spans' bookkeeping was about a fiftieth
    of the fuzzer's CPU.
    """

    def do_draw(self, data: Any) -> CrashPlan | None:
        if not data.draw_integer(0, 1):
            return None
        boundary = data.draw_integer(1, MAX_BOUNDARY)
        mode = MODES[data.draw_integer(0, len(MODES) - 1)]
        seed = data.draw_integer(0, IMAGE_SEEDS - 1)
        again = data.draw_integer(0, 1)
        recovery_crash = data.draw_integer(1, MAX_RECOVERY_BOUNDARY) if again else None
        return CrashPlan(boundary, mode, seed, recovery_crash)

    def __repr__(self) -> str:
        return "maybe_crash"


def _maybe_crash_built() -> SearchStrategy[CrashPlan | None]:
    """What :class:`_MaybeCrash` draws, built of public strategies (eleven spans a plan):
    for a Hypothesis whose engine data lacks the integer choice it makes directly."""
    return st.none() | st.builds(
        CrashPlan,
        boundary=st.integers(1, MAX_BOUNDARY),
        mode=st.sampled_from(MODES),
        seed=st.integers(0, IMAGE_SEEDS - 1),
        recovery_crash=st.none() | st.integers(1, MAX_RECOVERY_BOUNDARY),
    )


maybe_crash: SearchStrategy[CrashPlan | None] = (
    _MaybeCrash() if ENGINE_CHOICES else _maybe_crash_built()
)
"""Half the operations crash; shrinking prefers the ones that do not."""


class CrashRecoveryMachine(RuleBasedStateMachine):
    """Subclass and set ``profile``, ``slots``, ``provider`` or ``make_registry``."""

    profile = "posix"
    slots = 2
    provider = "scripted"
    checkpoints: CheckpointPolicy | None = None
    """The checkpoint policy (None: the orchestrator's default)."""

    def make_registry(self) -> ProviderRegistry:
        return scripted_registry()

    def __init__(self) -> None:
        super().__init__()
        # No automatic collections while the example runs: a crash inside an
        # operation collects in full anyway (faultfs buries the crashed run's objects
        # while its disk is still active), and so does the end of the held
        # interception below; the collector's own passes in between (about 7 an
        # example) freed what those would free a few steps later, for about a
        # sixtieth of the fuzzer's CPU.
        self._collecting = gc.isenabled()
        gc.disable()
        # Held for the whole example: each step's activation of the disk is then
        # a push and a pop, not a patch of every intercepted function.
        self._held = held_interception()
        try:
            self._held.__enter__()
        except BaseException:
            self._collect_again()
            raise
        try:
            self.harness = CrashHarness(
                profile=self.profile,
                slots=self.slots,
                registry=self.make_registry,
                provider=self.provider,
                checkpoints=self.checkpoints,
            )
        except BaseException:
            try:
                self._held.__exit__(None, None, None)
            finally:
                self._collect_again()
            raise
        self.crashes = 0

    def teardown(self) -> None:
        try:
            self.harness.close()
        finally:
            try:
                self._held.__exit__(None, None, None)
            finally:
                self._collect_again()

    def _collect_again(self) -> None:
        if self._collecting:
            gc.enable()

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
        """Any operation on the current tree (what the EIO rule makes fail)."""
        paths = self._paths()
        if not paths:
            return Step("create_root", pick(data, NAMES, "name"))
        kind = pick(data, STEP_KINDS, "operation")
        agent = pick(data, paths, "agent")
        if kind == "create_root":
            return Step(kind, pick(data, NAMES, "name"))
        if kind in ("spawn", "terminate_by_parent"):
            return Step(kind, agent, pick(data, NAMES, "child"))
        if kind in ("send", "ask"):
            return Step(kind, agent, pick(data, [*paths, "user"], "to"))
        return Step(kind, agent)

    def _step(self, step: Step, crash: CrashPlan | None = None) -> None:
        """Run ``step``; with a plan, crash in it (or right after it), recover and check."""
        if crash is None:
            self.harness.run(step)
            return
        ran = self.harness.run(step, crash_at=crash.boundary)
        cycle = self.harness.crash_and_recover(
            crash.mode, crash.seed, recovery_crash_at=crash.recovery_crash
        )
        self.crashes += 1
        event(f"crash mode: {crash.mode}")
        event("crash inside the operation" if ran.crashed else "crash after the operation")
        if cycle.recovery_crashed:
            event("recovery itself crashed")

    # -- rules -----------------------------------------------------------------

    @initialize(name=st.sampled_from(NAMES))
    def first_root(self, name: str) -> None:
        self._step(Step("create_root", name))

    @rule(name=st.sampled_from(NAMES), crash=maybe_crash)
    def create_root(self, name: str, crash: CrashPlan | None) -> None:
        self._step(Step("create_root", name), crash)

    @precondition(_has_agents)
    @rule(data=st.data(), name=st.sampled_from(NAMES), crash=maybe_crash)
    def spawn_child(self, data: Any, name: str, crash: CrashPlan | None) -> None:
        self._show_step(Step("spawn", pick(data, self._paths(), "parent"), name), crash)

    @precondition(_has_agents)
    @rule(data=st.data(), ask=st.booleans(), crash=maybe_crash)
    def send_message(self, data: Any, ask: bool, crash: CrashPlan | None) -> None:
        paths = self._paths()
        src = pick(data, paths, "from")
        dst = pick(data, [*paths, "user"], "to")
        self._show_step(Step("ask" if ask else "send", src, dst), crash)

    @precondition(_has_agents)
    @rule(data=st.data(), crash=maybe_crash)
    def broadcast(self, data: Any, crash: CrashPlan | None) -> None:
        self._show_step(Step("broadcast", pick(data, self._paths(), "from")), crash)

    @precondition(_has_agents)
    @rule(data=st.data(), crash=maybe_crash)
    def check_inbox(self, data: Any, crash: CrashPlan | None) -> None:
        self._show_step(Step("inbox", pick(data, self._paths(), "agent")), crash)

    @precondition(_has_agents)
    @rule(data=st.data(), kind=st.sampled_from(("turn", "complete")), crash=maybe_crash)
    def run_turn(self, data: Any, kind: str, crash: CrashPlan | None) -> None:
        self._show_step(Step(kind, pick(data, self._paths(), "agent")), crash)

    @precondition(_has_agents)
    @rule(data=st.data(), crash=maybe_crash)
    def terminate_leaf(self, data: Any, crash: CrashPlan | None) -> None:
        self._show_step(Step("terminate", pick(data, self._leaves(), "leaf")), crash)

    @precondition(_has_agents)
    @rule(data=st.data(), child=st.sampled_from(NAMES), crash=maybe_crash)
    def terminate_by_parent(self, data: Any, child: str, crash: CrashPlan | None) -> None:
        self._show_step(
            Step("terminate_by_parent", pick(data, self._paths(), "parent"), child), crash
        )

    @precondition(_has_agents)
    @rule(data=st.data(), crash=maybe_crash)
    def eviction(self, data: Any, crash: CrashPlan | None) -> None:
        self._show_step(Step("evict", pick(data, self._paths(), "agent")), crash)

    @precondition(_has_agents)
    @rule(crash=maybe_crash)
    def wake_loop(self, crash: CrashPlan | None) -> None:
        self._step(Step("pending"), crash)

    @precondition(_has_agents)
    @rule(crash=maybe_crash)
    def read_user_inbox(self, crash: CrashPlan | None) -> None:
        self._step(Step("user_inbox"), crash)

    @precondition(_has_agents)
    @rule(data=st.data(), crash=maybe_crash)
    def checkpoint(self, data: Any, crash: CrashPlan | None) -> None:
        """Checkpoint one log, or all of them (sealing and compacting by the policy)."""
        self._show_step(Step("checkpoint", pick(data, ["", *self._paths()], "log")), crash)

    @rule(data=st.data())
    def fsync_failure_and_crash(self, data: Any) -> None:
        step = self._draw_step(data)
        nth = integer(data, 1, MAX_FSYNC, "failing fsync")
        count = integer(data, 1, MAX_CONSECUTIVE_FAILURES, "failures in a row")
        written = flag(data, "written back anyway")
        mode = pick(data, MODES, "mode")
        seed = integer(data, 0, IMAGE_SEEDS - 1, "image seed")
        if flag(data, "go on after it"):
            self.fail_fsyncs_and_go_on(step, nth, count, written, mode, seed)
        else:
            self.fail_fsyncs_and_crash(step, nth, count, written, mode, seed)

    def fail_fsyncs_and_crash(
        self,
        step: Step,
        nth: int,
        count: int,
        written: bool,
        mode: str,
        seed: int,
        where: str | None = None,
        entry: str | None = None,
    ) -> None:
        """The EIO rule's step with what it drew (the call a counterexample shows)."""
        outcome = self._fail_fsyncs("crash", step, nth, count, written, mode, seed, where, entry)
        self.harness.crash_and_recover(mode, seed)
        self.crashes += 1
        event(f"after EIO: {outcome}")

    def fail_fsyncs_and_go_on(
        self,
        step: Step,
        nth: int,
        count: int,
        written: bool,
        mode: str,
        seed: int,
        where: str | None = None,
        entry: str | None = None,
    ) -> None:
        """The EIO rules' step without a crash (the call a counterexample shows): the
        running state is checked (:func:`oracle.refused.check_after_eio`) and the
        next steps run on the same orchestrator; only an undecided outcome, which a
        restart settles, crashes (in ``mode`` and image ``seed``) and recovers."""
        outcome = self._fail_fsyncs("go_on", step, nth, count, written, mode, seed, where, entry)
        if outcome in OUTCOMES_GOING_ON and self.harness.model.inflight is None:
            check_after_eio(self.harness, outcome)
            event(f"EIO, going on: {outcome}")
            return
        # undecided (a turn of the wake loop's too, left in flight): a restart settles it
        self.harness.crash_and_recover(mode, seed)
        self.crashes += 1
        event(f"EIO, going on: {outcome}, then a crash")

    def _fail_fsyncs(
        self, then: str, step: Step, nth: int, count: int, written: bool, *drawn: Any
    ) -> str:
        """Show the call ``state.fail_fsyncs_and_<then>(...)`` and run ``step`` with its
        fsyncs failing; ``drawn`` is (mode, seed, where, entry): ``where`` and ``entry``
        name the appends whose fsyncs ``nth`` counts (the targeted rule's, see
        :func:`oracle.faults.failing_fsync`)."""
        mode, seed, where, entry = drawn
        self._show(
            f"state.fail_fsyncs_and_{then}({step!r}, nth={nth}, count={count}, "
            f"written={written}, mode={mode!r}, seed={seed}"
            + ("" if where is None else f", where={where!r}, entry={entry!r}")
            + ")"
        )
        return self.harness.run_failing_fsyncs(
            step, nth, count, written=written, where=where, entry=entry
        )

    @precondition(_has_agents)
    @rule(data=st.data())
    def fsync_failure_where_it_matters(self, data: Any) -> None:
        """An EIO at the fsync that decides an operation (:mod:`oracle.eio_targets`): the
        acknowledge of the user's inbox, a turn's start or commit (a send, a spawn, an
        ``@inbox`` read, a parent's termination), a message's delivery, a leaf's
        termination. Unless it draws a crash after it, the steps go on on the running
        orchestrator (``fail_fsyncs_and_go_on``)."""
        target = draw_target(data, self._paths(), self._leaves(), NAMES)
        log_of, entry = pick(data, target.points, "failing append")
        count = integer(data, 1, MAX_CONSECUTIVE_FAILURES, "failures in a row")
        written = flag(data, "written back anyway")
        mode = pick(data, MODES, "mode")
        seed = integer(data, 0, IMAGE_SEEDS - 1, "image seed")
        crash = flag(data, "crash after it")  # shrinks to going on, the running check
        for step in target.setup:
            self._show_step(step)
        where = self._log_path(log_of)
        if where is None:  # the setup's step did not make what the target needs
            return
        event(f"targeted EIO at: {target.kind} ({entry})")
        args = (target.step, 1, count, written, mode, seed, where, entry)
        if crash:
            self.fail_fsyncs_and_crash(*args)
        else:
            self.fail_fsyncs_and_go_on(*args)

    def _log_path(self, endpoint: str) -> str | None:
        """The log file of the agent at path ``endpoint`` (or the user's), None if none."""
        orch = self.harness.orch
        if endpoint == USER_ENDPOINT:
            return orch.logs.path_text(USER)
        try:
            node = orch.tree.resolve(endpoint)
        except SubstratError:
            return None
        return orch.logs.path_text(node.session_id)

    @precondition(_has_agents)
    @rule(data=st.data())
    def send_then_crash_reading_the_inbox(self, data: Any) -> None:
        """A message sent, then its reader's ``@inbox`` turn cut: nothing consumed
        before the commit may count as delivered."""
        paths = self._paths()
        src = pick(data, paths, "from")
        dst = pick(data, [p for p in paths if p != src] or paths, "to")
        self._show_step(Step("send", src, dst))
        if dst == src:
            return
        self._crash_during(Step("inbox", dst), data)

    @precondition(_has_agents)
    @rule(data=st.data(), child=st.sampled_from(NAMES), grandchild=st.sampled_from(NAMES))
    def crash_in_a_cascading_termination(self, data: Any, child: str, grandchild: str) -> None:
        """A parent terminates a child that has a child of its own, and the crash cuts
        the cascade: recovery must finish it."""
        parent = pick(data, self._paths(), "parent")
        self._show_step(Step("spawn", parent, child))
        self._show_step(Step("spawn", f"{parent}/{child}", grandchild))
        self._crash_during(Step("terminate_by_parent", parent, child), data)

    def _crash_during(self, step: Step, data: Any) -> None:
        boundary = integer(data, 1, MAX_BOUNDARY, "boundary")
        mode = pick(data, MODES, "mode")
        seed = integer(data, 0, IMAGE_SEEDS - 1, "image seed")
        self.crash_during(step, boundary, mode, seed)

    def crash_during(self, step: Step, boundary: int, mode: str, seed: int) -> None:
        """A targeted rule's crash with what it drew (the call a counterexample shows)."""
        self._show(f"state.crash_during({step!r}, boundary={boundary}, mode={mode!r}, seed={seed})")
        ran = self.harness.run(step, crash_at=boundary)
        self.harness.crash_and_recover(mode, seed)
        self.crashes += 1
        event("targeted crash inside" if ran.crashed else "targeted crash after")

    # -- how a counterexample prints a rule that draws from st.data() ------------------

    _shown: list[str] | None = None
    _noting: bool | None = None
    """Whether this example prints its steps, asked once (see :func:`_show`)."""

    def _show_step(self, step: Step, crash: CrashPlan | None = None) -> None:
        self._show(
            f"state._step({step!r})" if crash is None else f"state._step({step!r}, {crash!r})"
        )
        self._step(step, crash)

    def _show(self, call: str) -> None:
        """Note ``call`` for the step's line, on the replay that prints a counterexample
        (see _repr_step); otherwise nothing is formatted.

        Asked once an example (a machine is made for each one): the replay that
        prints a counterexample, or a verbose run, prints all of its steps (see
        :func:`oracle.draws.noting` for what an ask costs)."""
        if self._noting is None:
            self._noting = should_note()
        if self._noting:
            self._shown = [*(self._shown or []), call]

    def _repr_step(self, rule: Any, data: Any, result: Any) -> str:
        """The steps of the rules that draw from ``st.data()`` (the EIO and targeted-crash
        rules, and those that pick an agent) as the calls they made, where
        Hypothesis prints ``state.rule(data=data(...))``, which a reader cannot replay.

        Hypothesis's own hook for a step's line (private: a Hypothesis that renames
        it prints its line again, and test_crash_machine fails on it).
        """
        shown, self._shown = self._shown, None
        return "\n".join(shown) if shown else super()._repr_step(rule, data, result)

    # -- invariants ----------------------------------------------------------------

    @invariant()
    def matches_the_model(self) -> None:
        self.harness.check_running()
