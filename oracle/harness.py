"""Crash, recover, check: one orchestrator on faultfs and its shadow model.

:class:`CrashHarness` owns a simulated disk (:class:`faultfs.FaultFS`), the
orchestrator running on it, the model of what it acknowledged and an event
loop. ``run(step, crash_at=k)`` runs one step with a crash armed at the
k-th I/O boundary; ``crash_and_recover(mode, seed)`` takes the crash image,
recovers a fresh orchestrator on it (optionally crashing recovery itself
first) and checks it with :func:`oracle.checks.check_recovery`.
``check_running()`` compares the running orchestrator with the model between
steps, re-reading only the logs that changed since it last looked.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from faultfs import FaultFS, SimulatedCrash
from oracle.checks import Memos, check_recovery, diff, expected, observe
from oracle.errors import OracleViolation
from oracle.faults import failing_fsync
from oracle.model import Model
from oracle.workload import Driver, Step
from substrat.checkpointer import CheckpointPolicy
from substrat.errors import DurabilityError, OutcomeUnknownError
from substrat.orchestrator import Orchestrator
from substrat.providers.registry import ProviderRegistry
from substrat.providers.scripted import ScriptedProvider

DEFAULT_ROOT = "/substrat-oracle/root"
HOLD_ROOT = "/substrat-oracle-interception-hold"
DEFAULT_SLOTS = 2
_EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
_FAST_TICKS = 60_000_000

T = TypeVar("T")


def scripted_registry() -> ProviderRegistry:
    registry = ProviderRegistry()
    registry.register("scripted", ScriptedProvider)
    return registry


@contextmanager
def held_interception() -> Iterator[None]:
    """Keep faultfs's interception installed while the block runs.

    Activating a FaultFS when none is active patches every intercepted
    function (and unpatches them when it is left), which costs more than a
    step of the fuzzer; with another one held active for the whole example,
    each step's activation of the harness's disk is a push and a pop. The held
    one owns a root nothing uses, so it changes no call's outcome.
    """
    with FaultFS(HOLD_ROOT, record_trace=False):
        yield


@dataclass
class CycleResult:
    crashed: bool
    boundary: int | None
    recovery_crashed: bool = False


class CrashHarness:
    """A crash-recovery loop around one simulated root (see the module docstring)."""

    def __init__(
        self,
        *,
        root: str = DEFAULT_ROOT,
        profile: str = "posix",
        slots: int = DEFAULT_SLOTS,
        record_trace: bool = False,
        registry: Callable[[], ProviderRegistry] = scripted_registry,
        provider: str = "scripted",
        checkpoints: CheckpointPolicy | None = None,
    ) -> None:
        self.fs = FaultFS(root, profile=profile, record_trace=record_trace)
        self.checkpoints = checkpoints
        self.root = root
        self.slots = slots
        self.make_registry = registry
        self.provider = provider
        self.model = Model()
        self.loop = asyncio.new_event_loop()
        self._next_id = self._next_tick = 1
        self.tokens = itertools.count(1)
        self.cycles = 0
        # What the checks derived from each log, derived again when the log changes.
        self.memos = Memos.new()
        self._checked = False
        self.orch, self.driver = self._open()

    # deterministic ids and clock: a failing example replays byte for byte
    def _new_id(self) -> str:
        self._next_id += 1
        return f"{self._next_id - 1:032x}"

    def _clock(self) -> str:
        tick = self._next_tick
        self._next_tick += 1
        if tick < _FAST_TICKS:  # the first minute, formatted without a datetime (each event)
            return f"2026-01-01T00:00:{tick // 1_000_000:02d}.{tick % 1_000_000:06d}+00:00"
        return (_EPOCH + timedelta(microseconds=tick)).isoformat(timespec="microseconds")

    def _within_fs(self, coro: Coroutine[Any, Any, T]) -> T:
        with self.fs:
            return self.loop.run_until_complete(coro)

    def _orchestrator_on(self, image: FaultFS) -> Orchestrator:
        with image:
            return self._open_here()

    def _open_here(self) -> Orchestrator:
        """Open a fresh orchestrator on the disk that is active now."""
        return self.loop.run_until_complete(self._opening())

    def _opening(self) -> Coroutine[Any, Any, Orchestrator]:
        return Orchestrator.open(
            self.root,
            registry=self.make_registry(),
            slots=self.slots,
            clock=self._clock,
            new_id=self._new_id,
            checkpoints=self.checkpoints,
        )

    async def _restart(self) -> Orchestrator:
        """The ``stop`` step (see oracle.workload.Driver): a clean stop, then a start."""
        await self.orch.close()
        self.orch = await self._opening()
        return self.orch

    def recover(self, image: FaultFS) -> Orchestrator:
        """Open a fresh orchestrator on ``image`` (recovery runs; nothing is checked)."""
        return self._orchestrator_on(image)

    def _open(self) -> tuple[Orchestrator, Driver]:
        orch = self._orchestrator_on(self.fs)
        return orch, self._driver(orch)

    def _driver(self, orch: Orchestrator) -> Driver:
        return Driver(orch, self.model, self.tokens, provider=self.provider, restart=self._restart)

    @property
    def counters(self) -> tuple[int, int]:
        """The next id and clock tick: with these restored (``counters = saved``), a
        recovery writes the same bytes as one run when they were saved."""
        return self._next_id, self._next_tick

    @counters.setter
    def counters(self, saved: tuple[int, int]) -> None:
        self._next_id, self._next_tick = saved

    def run_steps(self, steps: list[Step], *, crash_at: int | None = None) -> int | None:
        """Run steps in order with one crash armed across them; the crashed step's index."""
        if crash_at is not None:
            self.fs.arm(crash_at)
        done = 0
        try:
            for step in steps:
                self._within_fs(self.driver.perform(step))
                done += 1
        except SimulatedCrash:
            return done
        finally:
            self.fs.disarm()
        return None

    def check_image(self, image: FaultFS, model: Model) -> None:
        """Recover a fresh orchestrator on ``image`` and check it against ``model``.

        Leaves this harness (its disk, orchestrator and model) untouched, so
        every image of one crash point can be checked in turn. What the check
        derives from each log is kept in the harness's memos, keyed by the log's
        bytes on ``image`` (as :meth:`crash_and_recover` does): the images of one
        crash point, and of the points after it, mostly hold the same bytes in most
        logs, so a log is read and parsed again only where they differ.
        """
        with image:  # one activation for the recovery and its check (each costs a patch
            # of every intercepted function and a collection when none is held)
            orch = self._open_here()
            model.settle(check_recovery(model, orch, memos=self.memos, fs=image))

    def close(self) -> None:
        self.loop.close()

    def run(self, step: Step, *, crash_at: int | None = None) -> CycleResult:
        """Run ``step``; with ``crash_at``, crash at that boundary inside it (if it has one)."""
        self._checked = False
        start = self.fs.boundaries
        if crash_at is not None:
            self.fs.arm(crash_at)
        try:
            self._within_fs(self.driver.perform(step))
        except SimulatedCrash:
            return CycleResult(True, self.fs.boundaries - start)
        finally:
            self.fs.disarm()
        return CycleResult(False, None)

    def run_failing_fsyncs(
        self,
        step: Step,
        nth: int,
        count: int = 1,
        *,
        written: bool = False,
        where: str | None = None,
        entry: str | None = None,
    ) -> str:
        """Run ``step`` with fsyncs ``nth`` .. ``nth + count - 1`` inside it failing (EIO).

        With ``where`` (a file's path, say ``orch.logs.path_text(endpoint)``),
        ``nth`` counts only that file's fsyncs, of its ``entry`` appends if given
        (:func:`oracle.faults.failing_fsync`).
        Returns ``done`` (no failure reached an answer: acknowledged as usual, or a
        turn reported failed), ``failed`` (the operation raised DurabilityError: it did not
        happen, and must not come back after any crash) or ``undecided``
        (OutcomeUnknownError: it stays in flight, and only :meth:`crash_and_recover`
        may follow). After ``done`` or ``failed`` the running orchestrator must
        still equal the model (:func:`oracle.refused.check_after_eio`), and the
        steps may go on on it.
        """
        self._checked = False
        failing = failing_fsync(self.fs, nth, count, written=written, where=where, entry=entry)
        with self.fs, failing:
            try:
                self.loop.run_until_complete(self.driver.perform(step))
            except OutcomeUnknownError:
                return "undecided"
            except DurabilityError as exc:
                self.model.fail(f"I/O error: {exc}")
                return "failed"
        return "done"

    def crash_and_recover(
        self,
        mode: str,
        seed: int = 0,
        *,
        recovery_crash_at: int | None = None,
        recovery_mode: str = "power",
    ) -> CycleResult:
        """Crash now (if the disk has not already), recover, and check against the model.

        With ``recovery_crash_at``, recovery itself is crashed at that boundary (in
        ``recovery_mode``) and run again on what the crash left. A boundary past
        recovery's last one does not crash it: that recovery finished, and it is the
        one checked. (Until session 22 it was abandoned as if killed and recovery ran
        again on the same disk; that scenario, a start on what a finished recovery
        left, is tests/integration/test_recovery_idempotence.py's, which also asserts
        that the second start writes nothing: docs/benchmarks.md, "The crash fuzzer's
        recovery crashes past recovery's end".)
        """
        self.model.crashed()
        self.fs = image = self.fs.crash_image(mode, seed=seed)
        if recovery_crash_at is not None:
            image.arm(recovery_crash_at)
            try:
                return self._recover_and_check(image, recovery_crashed=False)
            except SimulatedCrash:  # open gave back its hold on the root
                self.fs = image = image.crash_image(recovery_mode, seed=seed)
                return self._recover_and_check(image, recovery_crashed=True)
        return self._recover_and_check(image, recovery_crashed=False)

    def _recover_and_check(self, image: FaultFS, *, recovery_crashed: bool) -> CycleResult:
        """Recover on ``image`` (crashing where it is armed) and check against the model."""
        with image:  # one activation for the recovery and its check
            self.orch = self._open_here()
            image.disarm()  # past the end of recovery: no crash in the check's reads either
            self.driver = self._driver(self.orch)
            accepted = check_recovery(self.model, self.orch, memos=self.memos, fs=image)
        self.model.settle(accepted)
        self.cycles += 1
        self._checked = True  # check_recovery compared this very state with the model
        return CycleResult(True, None, recovery_crashed)

    def check_running(self) -> None:
        """The running orchestrator equals the model, no agent is BUSY, the tree is whole.

        Right after :meth:`crash_and_recover` there is nothing to do: its check
        compared the same state, and more. Otherwise each conversation is read
        from its log only if the log changed since the last look.
        """
        if self._checked:
            return
        with self.fs:
            got = observe(self.orch, memos=self.memos, fs=self.fs)
        names = {a.agent_id: a.name for a in self.model.state.agents.values()}
        problems = diff(expected(self.model.state), got, names)
        if problems:
            raise OracleViolation(
                "running state differs from the model:\n  " + "\n  ".join(problems),
                trace=self.model.trace_lines(),
            )
        self.orch.tree.check()
        for node in self.orch.tree.walk():
            assert node.state.value != "busy", f"{node.name} is stuck BUSY between steps"
        self._checked = True
