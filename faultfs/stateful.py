"""Crash-recovery state machines for your own storage code, in Hypothesis's style.

Subclass :class:`CrashStateMachine`, write rules with this module's
:func:`rule` (a drop-in for :func:`hypothesis.stateful.rule`) that perform
operations on your store and record what it acknowledged, and say how to
recover and what the recovered store must hold::

    from hypothesis import strategies as st
    from faultfs.stateful import CrashStateMachine, rule

    class KVMachine(CrashStateMachine):
        def recover(self):                      # at the start and after every crash
            self.store = KVStore(self.fs.root)  # KVStore's own recovery runs here

        @rule(key=st.sampled_from("ab"), value=st.text(max_size=3))
        def put(self, key, value):
            with self.acknowledging(("put", key, value)):
                self.store.put(key, value)

        def observe(self):
            return self.store.items()

        def expected(self, acked):
            state = {}
            for _op, key, value in acked:
                state[key] = value
            return state

    TestKV = KVMachine.TestCase

Every rule gets a ``crash`` argument: ``None`` (run it), or a :class:`Crash`
that crashes it at an I/O boundary inside it (or right after it) in a crash
mode, takes one crash image, recovers (itself crashed sometimes), and checks
the recovered store against the acknowledged operations. The file-system
profile is drawn once per run. Hypothesis shrinks a failure to a short list
of steps, printed as code.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

try:
    from hypothesis import strategies as st
except ImportError:  # pragma: no cover - depends on the environment
    raise ImportError(
        "faultfs.stateful builds on Hypothesis, which is not installed: pip install hypothesis"
    ) from None
from hypothesis.stateful import (
    Bundle,
    MultipleResults,
    RuleBasedStateMachine,
    consumes,
    multiple,
    precondition,
)
from hypothesis.stateful import initialize as _initialize
from hypothesis.stateful import invariant as _invariant
from hypothesis.stateful import rule as _rule

from faultfs import (
    _check_posix,  # noqa: F401  (first: on Windows it says why faultfs cannot run)
    _health,
    _realdisk,
    _swallowed,
)
from faultfs import _stateful_plan as _plan
from faultfs._causes import CrashPoint, Finding, Outcome
from faultfs._escapes import dead_finalizers
from faultfs._fs import DEFAULT_BLOCK_SIZE, FaultFS
from faultfs._handoff import named_inside
from faultfs._health import HealthCheck
from faultfs._images import MODES
from faultfs._model import Model
from faultfs._profiles import get_profile
from faultfs._wording import Where, describe, exception_words
from faultfs.errors import (
    ConfigError,
    CrashSwallowed,
    EscapeError,
    FailedHealthCheck,
    OutsideRootError,
    RecoveryCheckFailed,
    SimulatedCrash,
)

__all__ = [
    "Bundle",
    "Crash",
    "CrashStateMachine",
    "consumes",
    "initialize",
    "invariant",
    "multiple",
    "precondition",
    "rule",
]

# The argument every crashable rule takes (the drawn crash plan, or None).
CRASH_ARG = "crash"
IMAGE_SEEDS = _plan.IMAGE_SEEDS
_MARKER = "_faultfs_rule"
_MISSING = object()


@dataclass(frozen=True)
class Crash:
    """Where a step crashes and what the crash leaves.

    ``at`` is the I/O boundary inside the step (each mutating call has one
    before and one after it; past the step's last boundary the crash comes
    right after the step returned). ``mode`` is the crash mode, ``image`` the
    seed that picks one of its images. ``recovery_at``, if set, crashes
    recovery too at that boundary (same mode and seed), then recovers again.
    """

    at: int
    mode: str
    image: int = 0
    recovery_at: int | None = None

    def __repr__(self) -> str:
        extra = "" if not self.image else f", image={self.image}"
        if self.recovery_at is not None:
            extra += f", recovery_at={self.recovery_at}"
        return f"Crash(at={self.at}, mode={self.mode!r}{extra})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))


class _RuleSpec(NamedTuple):
    function: Callable[..., Any]
    crashes: bool
    targets: Any
    target: Any
    arguments: dict[str, Any]


def rule(
    *,
    targets: Sequence[Bundle[Any]] = (),
    target: Bundle[Any] | None = None,
    crashes: bool = True,
    **kwargs: st.SearchStrategy[Any],
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """:func:`hypothesis.stateful.rule` for a :class:`CrashStateMachine`.

    The rule runs inside the machine's FaultFS. Unless ``crashes=False``, it
    also takes a drawn ``crash`` argument (a :class:`Crash` or ``None``): the
    base class crashes the step there, recovers and checks. Give
    ``crashes=False`` to rules that only read.
    """
    _plan.check_rule_arguments(kwargs, CRASH_ARG)

    def mark(function: Callable[..., Any]) -> Callable[..., Any]:
        spec = _RuleSpec(function, crashes, targets, target, dict(kwargs))
        setattr(function, _MARKER, spec)
        return function

    return mark


def initialize(
    *, targets: Sequence[Bundle[Any]] = (), target: Bundle[Any] | None = None, **kwargs: Any
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """:func:`hypothesis.stateful.initialize`, run inside the machine's FaultFS (never crashed)."""

    def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def step(self: CrashStateMachine, **arguments: Any) -> Any:
            with named_inside(self.fs):
                return function(self, **arguments)

        decorator: Any = _initialize(targets=targets, target=target, **kwargs)  # type: ignore[arg-type]
        return _wrapped(decorator(step))

    return decorate


def invariant(
    *, check_during_init: bool = False
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """:func:`hypothesis.stateful.invariant`, run inside the machine's FaultFS."""

    def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def check(self: CrashStateMachine) -> Any:
            with named_inside(self.fs):
                return function(self)

        return _wrapped(_invariant(check_during_init=check_during_init)(check))

    return decorate


def _wrapped(function: Any) -> Any:
    setattr(function, _plan.WRAPPED, True)
    return function


class CrashStateMachine(RuleBasedStateMachine):
    """A Hypothesis state machine whose steps crash, recover and check.

    Override :meth:`recover` (open the store on ``self.fs``; its recovery
    runs here) and either :meth:`observe` and :meth:`expected`, or
    :meth:`check`. Mark what the store acknowledged with
    :meth:`acknowledging` (or :meth:`ack`). Optional: :meth:`setup` for files
    that exist before the first step.

    Class attributes configure the crashes: ``profiles`` (drawn once per
    run), ``modes``, ``root`` (the simulated directory, never touched on the
    real disk), ``block_size`` (bytes, the torn-write unit of the block-based
    profiles: at 4096 a small append inside one block is never torn into a
    partial prefix there), ``max_crash_at`` (how deep inside a step a crash is
    drawn, in boundaries), ``crash_recovery`` (whether recovery itself is
    crashed too), ``outside`` (``"refuse"``: I/O on a path outside the root
    raises OutsideRootError; ``"passthrough"``: it reaches the real disk) and
    ``suppress_health_check`` (the :class:`~faultfs.HealthCheck` names to
    turn off: ``outside_root``, ``nothing_acknowledged``).
    """

    root: ClassVar[str] = "/faultfs-machine"
    profiles: ClassVar[tuple[str, ...]] = ("posix", "ext4-ordered", "lazyfs")
    modes: ClassVar[tuple[str, ...]] = MODES
    block_size: ClassVar[int] = DEFAULT_BLOCK_SIZE
    max_crash_at: ClassVar[int] = 64
    crash_recovery: ClassVar[bool] = True
    outside: ClassVar[str] = "refuse"
    suppress_health_check: ClassVar[Sequence[HealthCheck | str]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _plan.check_config(cls)
        for name in dir(cls):
            value = getattr(cls, name, None)
            spec = getattr(value, _MARKER, None)
            if spec is None or not callable(value):
                continue
            # Rebuild every crashable rule for this class (its modes and
            # limits), from the function as it was before conversion.
            source = getattr(value, "_faultfs_source", value)
            arguments = dict(spec.arguments)
            if spec.crashes:
                arguments[CRASH_ARG] = _plan.crash_plans(cls, source.__name__, Crash)
            has_targets = spec.targets != () or spec.target is not None
            step = _step_function(source, spec.crashes, has_targets)
            converted = _rule(targets=spec.targets, target=spec.target, **arguments)(step)
            converted._faultfs_source = source
            setattr(converted, _MARKER, spec)
            setattr(cls, name, _wrapped(converted))
        if len(cls.profiles) > 1:
            draw = _initialize(profile=st.sampled_from(cls.profiles))
            cls.use_profile = _wrapped(draw(use_profile))
        elif hasattr(cls, "use_profile"):
            cls.use_profile = None

    def __init__(self) -> None:
        super().__init__()
        cls = type(self)
        _plan.check_hooks(cls, CrashStateMachine)
        # The real directory under root, if it exists: nothing may change it (faultfs._realdisk).
        self._real_before = _realdisk.state(cls.root)
        self.fs = FaultFS(cls.root, cls.profiles[0], cls.outside, block_size=cls.block_size)
        self.fs.watch_outside = True
        self.acked: list[Any] = []
        self.inflight: Any = None
        self.crashes = 0
        # The attributes recover() sets: the objects of one run of the program.
        self._run_attributes: set[str] = set()
        # Boundaries each rule (and recovery) passed so far in this example: where
        # the next crash of that rule is drawn (see faultfs._stateful_plan).
        self._boundaries_seen: dict[str, int] = {}
        self._off = _health.suppressed(cls.suppress_health_check)
        _plan.running(self)
        with named_inside(self.fs):
            self.setup()
        self._check_outside(self.fs, "setup()")
        self.fs.sync_all()
        # setup()'s files, all durable: a drawn profile starts the run again from them.
        self._setup_model = self.fs.model.clone() if len(cls.profiles) > 1 else None
        _plan.draw_profile_first(self)
        self._recover_on(self.fs)
        self._check_outside(self.fs, "recover()")
        self._started_clock = self.fs.model.clock

    # ---------------------------------------------------------------- hooks

    def setup(self) -> None:
        """Create what exists before the first step (runs inside ``self.fs``; made durable)."""

    def recover(self) -> None:
        """Open the store on ``self.fs``: at the start, and on every crash image."""
        raise NotImplementedError("override recover(): open your store on self.fs.root")

    def observe(self) -> Any:
        """The recovered store's state, comparable with :meth:`expected`'s result."""
        raise NotImplementedError("override observe() and expected(), or check()")

    def expected(self, acked: list[Any]) -> Any:
        """The state the acknowledged operations ``acked`` (in order) imply."""
        raise NotImplementedError("override observe() and expected(), or check()")

    def check(self) -> None:
        """After recovery: the store holds exactly what was acknowledged.

        The interrupted operation (``self.inflight``) may or may not have
        happened; if it did, it counts as acknowledged from now on. Override
        for other contracts (raise AssertionError on a violation; call
        :meth:`ack` for an in-flight effect that survived).
        """
        got = self.observe()
        want = self.expected(self.acked)
        if got == want:
            return
        if self.inflight is not None:
            with_inflight = self.expected([*self.acked, self.inflight])
            if got == with_inflight:
                self.ack(self.inflight)
                return
            raise AssertionError(
                f"recovered state {got!r}; the acknowledged operations require {want!r}, "
                f"or {with_inflight!r} if the interrupted {self.inflight!r} landed"
            )
        raise AssertionError(
            f"recovered state {got!r}; the acknowledged operations require {want!r}"
        )

    # -------------------------------------------------------------- helpers

    def ack(self, effect: Any) -> None:
        """Record that the store acknowledged ``effect``: it must survive any crash."""
        self.fs.ack(effect)  # first: after a crash it refuses (CrashSwallowed)
        self.acked.append(effect)
        _plan.tally(type(self)).acks += 1

    @contextlib.contextmanager
    def acknowledging(self, effect: Any) -> Iterator[None]:
        """``effect`` is in flight while the block runs, acknowledged when it returns."""
        self.inflight = effect
        yield
        self.inflight = None
        self.ack(effect)

    # ------------------------------------------------------------ machinery

    def _run_step(
        self, function: Callable[..., Any], arguments: dict[str, Any], plan: Crash | None
    ) -> Any:
        __tracebackhide__ = True
        disk, before = self.fs, self.fs.boundaries
        if plan is None:
            with named_inside(disk):
                result = function(self, **arguments)
            self._learn(function.__name__, disk.boundaries - before)
            self._check_outside(disk, f"{function.__name__}()")
            return result
        self.inflight = None
        disk.arm(plan.at)
        result = multiple()
        crashed_inside = False
        try:
            with named_inside(disk):
                result = function(self, **arguments)
        except SimulatedCrash:
            crashed_inside = True
        finally:
            disk.disarm()
        _swallowed.check(disk)  # it acknowledged after the crash, and swallowed the refusal too
        crashed_inside = crashed_inside or disk.crashed  # the step swallowed the crash
        passed = disk.boundaries - before
        self._learn(function.__name__, passed)
        self._check_outside(disk, f"{function.__name__}()")
        _plan.tally(type(self)).crashes += 1
        where = (
            f"at boundary {plan.at} inside"
            if crashed_inside
            else f"right after (it passed {passed} boundaries)"
        )
        self._crash_and_recover(plan, f"{plan.mode} crash {where} {function.__name__}()")
        return multiple() if crashed_inside else result

    def _crash_and_recover(self, plan: Crash, what: str) -> None:
        __tracebackhide__ = True
        self.crashes += 1
        crashed = self.fs
        acked, inflight = list(self.acked), self.inflight
        image = crashed.crash_image(plan.mode, seed=plan.image)
        # Killed, also when the crash came after the step: the dead run's buffered file
        # objects, freed by recover(), must not flush into the trace the causes are read from.
        crashed.crashed = True
        analysable = True
        try:
            if plan.recovery_at is not None:
                image.arm(plan.recovery_at)
                try:
                    error = self._recover_and_check(image)
                except SimulatedCrash:
                    what += f", then a crash at boundary {plan.recovery_at} inside recovery"
                    analysable = False  # the failing image is an image of an image
                    self.acked, self.inflight = list(acked), inflight
                    image = image.crash_image(plan.mode, seed=plan.image)
                    error = self._recover_and_check(image)
                finally:
                    image.disarm()
            else:
                error = self._recover_and_check(image)
            if error is None:
                return
            origin = image.origin
            detail = origin.detail if origin is not None else ""
            message = (
                f"after a {what} (profile {image.profile}, image: {detail}) and recovery: {error}"
            )
            if analysable and _plan.reporting():
                message += _causes_text(self._analyse(crashed, image, acked, inflight), crashed)
        finally:
            self.inflight = None
        # A C extension's files on the real disk explain a failed recovery first.
        _realdisk.check(type(self).root, self._real_before)
        # Raised without its context: Hypothesis tells failures apart by where
        # they were raised, and every failed recovery is one kind of failure.
        raise RecoveryCheckFailed(message) from None

    def teardown(self) -> None:
        """End the example: the last run's objects are finalized on its disk, not the real one.

        A subclass that overrides it calls ``super().teardown()``.
        """
        _plan.running(None)
        self._retire_run(self.fs)
        _realdisk.check(type(self).root, self._real_before)

    @classmethod
    @functools.lru_cache
    def _to_test_case(cls) -> Any:
        """Hypothesis's TestCase, plus the health checks that need the whole run."""
        return _plan.with_run_checks(cls, super()._to_test_case())

    def _recover_on(self, disk: FaultFS) -> None:
        """recover() on ``disk``, learning how many boundaries it passes (a crashed one: at least
        as many as it reached)."""
        before = disk.boundaries
        try:
            with named_inside(disk):
                self._recover()
        finally:
            self._learn(_plan.RECOVERY, disk.boundaries - before)

    def _learn(self, key: str, passed: int) -> None:
        self._boundaries_seen[key] = max(passed, self._boundaries_seen.get(key, 0))

    def _check_outside(self, disk: FaultFS, who: str) -> None:
        __tracebackhide__ = True
        _health.check_outside(disk, f"{type(self).__name__}'s {who}", self._off, machine=True)

    def _recover(self) -> None:
        """Call recover(), noting which attributes it (re)binds (even if it crashes midway)."""
        before = dict(self.__dict__)
        try:
            self.recover()
        finally:
            self._run_attributes.update(
                name
                for name, value in self.__dict__.items()
                if before.get(name, _MISSING) is not value
            )
            del before

    def _retire_run(self, disk: FaultFS) -> None:
        """Drop the objects recover() made, finalizing them on ``disk``.

        The machine keeps a run's store in the attributes recover() sets, so the
        next recover() would free the crashed run's objects while the new image
        is active, and a finalizer that saves (``dbm.dumb``, ``shelve``,
        ``zipfile``: ``__del__`` calls ``close``) would write into the disk being
        checked. Dropped here with a crashed disk active instead, their I/O is
        refused as a killed process's is (a kill runs no finalizers); at the end
        of an example, on the live disk (a clean exit).
        """
        graveyard = [
            self.__dict__.pop(name) for name in sorted(self._run_attributes & set(self.__dict__))
        ]
        with disk, dead_finalizers():
            del graveyard[:]  # a crashed disk's exit also collects their cycles

    def _dead_disk(self) -> FaultFS:
        """A disk on the machine's root that refuses all I/O: the killed process's view."""
        dead = FaultFS(type(self).root, self.fs.profile, record_trace=False)
        dead.crashed = True
        return dead

    def _recover_and_check(self, image: FaultFS) -> str | None:
        """Recover on ``image`` and check it; the failure as text, or None."""
        self._retire_run(self._dead_disk())
        self.fs = image
        try:
            self._recover_on(image)
            with named_inside(image):
                self.check()
            self._check_outside(image, "recover() or the check")
        except (OutsideRootError, FailedHealthCheck, EscapeError, ConfigError, CrashSwallowed):
            raise  # the test's own mistake, not a failed recovery: shown as it is
        except AssertionError as exc:
            return str(exc) or "AssertionError"
        except Exception as exc:  # recovery that raises is a failed recovery
            return f"{exception_words(exc)}{_plan.raised_at(exc)}"
        return None

    def _analyse(
        self, crashed: FaultFS, image: FaultFS, acked: list[Any], inflight: Any
    ) -> list[Finding]:
        """Which unsynced operation the failure relied on (explore's cause analysis)."""
        origin = image.origin
        assert origin is not None
        failing = self.fs

        def verdict(model: Model) -> Outcome | None:
            candidate = crashed._spawn(model, origin.mode, None, origin.seed, "cause analysis")
            self.acked, self.inflight = list(acked), inflight
            error = self._recover_and_check(candidate)
            return None if error is None else Outcome(error, "", None)

        point = CrashPoint(
            crashed.model,
            crashed.trace,
            crashed.op_inodes,
            crashed.ack_marks,
            verdict,
            crashed.ack_buffered,  # an acknowledgement made before the flush is named so
        )
        try:
            return point.analyze(origin.choice, Outcome("", "", None))
        finally:
            self.fs, self.acked, self.inflight = failing, acked, inflight


def _causes_text(findings: list[Finding], crashed: FaultFS) -> str:
    where = Where(crashed.root, os.getcwd())
    text = ""
    for finding in findings:
        summary, fix = describe(finding.kind, finding.steps, finding.note, where)
        text += f"\ncause: {summary}\n  fix: {fix}"
    return text


def use_profile(self: CrashStateMachine, profile: str) -> None:
    """The file-system profile of this run (drawn once, before any other step)."""
    _plan.release_initializers(self)
    if profile == self.fs.profile:
        return  # __init__ ran under this profile already
    if self._setup_model is None or self.fs.model.clock != self._started_clock:
        raise ConfigError(
            f"{type(self).__name__}: the simulated disk changed between the first recover() and "
            "the profile draw (in __init__ after super().__init__(), or in an invariant): "
            "create starting files in setup(), and change them in rules"
        )
    # The first recover() ran under the first profile, and what it wrote is not
    # durable there; under the drawn profile it would become durable otherwise
    # (lazyfs keeps a create at once, posix needs the directory fsync). Making it
    # durable here would pass a store that never syncs what it creates on open.
    # So the run starts again, exactly: setup()'s durable files, recover() under
    # the drawn profile.
    self._retire_run(self.fs)
    disk = FaultFS(type(self).root, profile, type(self).outside, block_size=type(self).block_size)
    disk.watch_outside = True
    disk.model = self._setup_model.clone()
    disk.model.profile = get_profile(profile)
    self.fs, self.acked, self.inflight = disk, [], None
    self._recover_on(disk)
    self._check_outside(disk, "recover()")
    self._started_clock = disk.model.clock


def _step_function(
    function: Callable[..., Any], crashes: bool, has_targets: bool
) -> Callable[..., Any]:
    @functools.wraps(function)
    def step(self: CrashStateMachine, **arguments: Any) -> Any:
        __tracebackhide__ = True  # pytest shows the user's frames, not these
        plan = arguments.pop(CRASH_ARG, None) if crashes else None
        result = self._run_step(function, arguments, plan)
        if isinstance(result, MultipleResults) and not has_targets:
            return None  # a crashed step adds nothing to a bundle, and has none here
        return result

    return step
