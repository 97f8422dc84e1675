"""How a :class:`~faultfs.stateful.CrashStateMachine` draws its crashes, and checks its class.

A crash is drawn at an absolute boundary inside the step (``Crash.at``), so a
printed failure replays exactly. What the draw learns is how many boundaries
each rule (and recovery) passed earlier in the same example: half the draws
land inside that many, a quarter right after, a quarter anywhere up to
``max_crash_at``. The
counts come from the example's own earlier steps, so the same steps draw the
same crashes again (Hypothesis's replay and shrinking stay deterministic); a
rule not yet seen in the example is drawn among the first ``FIRST_GUESS``.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hypothesis import strategies as st

from faultfs._arguments import unknown_argument
from faultfs._health import check_acknowledged, suppressed
from faultfs._images import MODES
from faultfs._profiles import PROFILES
from faultfs._trace import display_path, is_user_file
from faultfs.errors import ConfigError

if TYPE_CHECKING:
    from faultfs.stateful import Crash, CrashStateMachine

# Image seeds drawn per crash: several images of one crash point differ.
IMAGE_SEEDS = 8
# Where a crash is drawn in a rule the example has not run yet: small steps
# (a put, a save) pass a handful of boundaries.
FIRST_GUESS = 8
# The key recovery's boundary count is learned under (no rule has this name).
RECOVERY = "<recovery>"
# Hypothesis's markers of its own stateful decorators.
_HYPOTHESIS_MARKERS = {
    "hypothesis_stateful_rule": "rule",
    "hypothesis_stateful_initialize_rule": "initialize",
    "hypothesis_stateful_invariant": "invariant",
}
# Set on what faultfs.stateful's decorators made.
WRAPPED = "_faultfs_wrapped"

# The machine Hypothesis is running: the draw reads what its example learned.
_running: list[CrashStateMachine] = []


def running(machine: CrashStateMachine | None) -> None:
    _running[:] = [] if machine is None else [machine]


def _at(learned: int | None, cap: int) -> st.SearchStrategy[int]:
    """A crash point: inside the step (half the draws), right after it (a quarter: its
    acknowledgements must survive too), or anywhere up to ``cap`` (a step that passes more
    boundaries than before, with bigger data or a compaction, is still reached)."""
    if learned is None:
        inside, after = min(cap, FIRST_GUESS), cap
    else:
        inside, after = min(cap, max(learned, 1)), min(cap, learned + 1)
    near = st.integers(1, inside)
    return st.one_of(near, near, st.just(after), st.integers(1, cap))


def crash_plans(
    cls: type[CrashStateMachine], name: str, crash: Callable[..., Crash]
) -> st.SearchStrategy[Crash | None]:
    """The ``crash`` argument of rule ``name``: None (most often), or a Crash."""

    def learned(key: str) -> int | None:
        machine = _running[0] if _running else None
        if not isinstance(machine, cls):
            return None
        return machine._boundaries_seen.get(key)

    @st.composite
    def plan(draw: Any) -> Crash:
        at = draw(_at(learned(name), cls.max_crash_at))
        mode = draw(st.sampled_from(cls.modes))
        image = draw(st.integers(0, IMAGE_SEEDS - 1))
        recovery_at = None
        if cls.crash_recovery:
            recovery_at = draw(st.one_of(st.none(), _at(learned(RECOVERY), cls.max_crash_at)))
        return crash(at=at, mode=mode, image=image, recovery_at=recovery_at)

    # Most steps run uncrashed (a crash resets the store), and None shrinks first.
    return st.one_of(st.none(), st.none(), plan())


def check_rule_arguments(kwargs: dict[str, Any], crash_arg: str) -> None:
    """rule()'s keyword arguments are strategies; a misspelled option of its own is not one."""
    if crash_arg in kwargs:
        raise ConfigError(f"a rule argument may not be called {crash_arg!r}: faultfs draws it")
    for name, value in kwargs.items():
        if not isinstance(value, st.SearchStrategy):
            wrong = unknown_argument("rule()", name, value, ("crashes", "target", "targets"))
            raise ConfigError(
                f"{wrong}, and the step's arguments as strategies (x=st.integers()): "
                f"{name}={value!r} is not one"
            )


def check_config(cls: type[CrashStateMachine]) -> None:
    name = cls.__name__
    for attribute in ("profiles", "modes", "suppress_health_check"):
        value = getattr(cls, attribute)
        if isinstance(value, str):  # a string is a sequence of one-letter "modes"
            raise ConfigError(
                f"{name}.{attribute} must be a tuple of names, not a string; "
                f"did you mean {attribute} = ({value!r},)?"
            )
    if not cls.profiles:
        raise ConfigError(f"{name}.profiles needs at least one profile")
    for profile in cls.profiles:
        if profile not in PROFILES:
            raise ConfigError(
                f"{name}.profiles: unknown profile {profile!r}; choose from {sorted(PROFILES)}"
            )
    for mode in cls.modes:
        if mode not in MODES:
            raise ConfigError(f"{name}.modes: unknown crash mode {mode!r}; choose from {MODES}")
    if cls.max_crash_at < 1:
        raise ConfigError(f"{name}.max_crash_at must be >= 1, got {cls.max_crash_at}")
    if cls.outside not in ("refuse", "passthrough"):
        raise ConfigError(f"{name}.outside must be 'refuse' or 'passthrough', got {cls.outside!r}")
    suppressed(cls.suppress_health_check)
    _check_decorators(cls)


def _check_decorators(cls: type[CrashStateMachine]) -> None:
    """Refuse Hypothesis's own rule/initialize/invariant on a CrashStateMachine.

    They would run outside the simulated disk (the store's paths then name the
    real disk: a bare FileNotFoundError) and, for a rule, never crash.
    """
    for attribute in dir(cls):
        value = getattr(cls, attribute, None)
        if value is None or getattr(value, WRAPPED, False):
            continue
        for marker, decorator in _HYPOTHESIS_MARKERS.items():
            if getattr(value, marker, None) is not None:
                raise ConfigError(
                    f"{cls.__name__}.{attribute} is decorated with hypothesis.stateful."
                    f"{decorator}; on a CrashStateMachine import it from faultfs.stateful "
                    f"instead (from faultfs.stateful import {decorator}): faultfs's "
                    f"{decorator} runs the step inside the simulated disk"
                    + (" and draws the crash that tests it" if decorator == "rule" else "")
                    + ", Hypothesis's runs it on the real disk."
                )


class Tally:
    """What one TestCase run of a machine class did, for the whole-run health checks."""

    def __init__(self) -> None:
        self.crashes = 0
        self.acks = 0


_TALLIES: weakref.WeakKeyDictionary[type, Tally] = weakref.WeakKeyDictionary()


def tally(cls: type, reset: bool = False) -> Tally:
    if reset or cls not in _TALLIES:
        _TALLIES[cls] = Tally()
    return _TALLIES[cls]


def with_run_checks(cls: type[CrashStateMachine], case: Any) -> Any:
    """``case`` (Hypothesis's TestCase of ``cls``) failing a passing run that acknowledged
    nothing, though it crashed steps (HealthCheck.nothing_acknowledged)."""
    run = case.runTest

    def runTest(self: Any) -> None:
        __tracebackhide__ = True
        done = tally(cls, reset=True)
        run(self)
        if done.crashes:
            check_acknowledged(
                done.acks,
                f"{cls.__name__} ran {done.crashes} crashed step(s), and",
                "Wrap each operation the store acknowledges in `with self.acknowledging(effect):` "
                "(or call self.ack(effect) once it returned), and have expected(acked) say what "
                "the acknowledged effects imply.",
                suppressed(cls.suppress_health_check),
            )

    for name in ("is_hypothesis_test", "_hypothesis_state_machine_class"):
        if hasattr(run, name):
            setattr(runTest, name, getattr(run, name))
    case.runTest = runTest
    return case


def check_hooks(cls: type[CrashStateMachine], base: type[CrashStateMachine]) -> None:
    """A machine that cannot check recovery fails as such, not as a store that lost data.

    Checked per run, not at class creation: an abstract base machine may leave
    the hooks to its subclasses.
    """
    if cls.check is not base.check:
        return
    missing = [
        name for name in ("observe", "expected") if getattr(cls, name) is getattr(base, name)
    ]
    if missing:
        raise ConfigError(
            f"{cls.__name__} does not define {' and '.join(f'{m}()' for m in missing)}: faultfs "
            "cannot tell a recovered store from a broken one. Define observe() (the recovered "
            "state) and expected(acked) (the state the acknowledged operations imply), or check()"
        )


def raised_at(exc: BaseException) -> str:
    """`` (at file:line)`` of the innermost user frame that raised ``exc``."""
    found = ""
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if is_user_file(code.co_filename):
            found = f" (at {display_path(code.co_filename, os.getcwd())}:{tb.tb_lineno})"
        tb = tb.tb_next
    return found


# The user's @initialize rules, held back until the profile is drawn.
_HELD = "_faultfs_held_initializers"


def draw_profile_first(machine: CrashStateMachine) -> None:
    """Make ``use_profile`` the first step Hypothesis draws, before the user's @initialize rules.

    Hypothesis picks among the initialize rules not run yet; an initialize rule that ran before
    the profile draw would write under the first profile, and use_profile would have to throw
    its writes away (it starts the run again from setup()'s state).
    """
    waiting = getattr(machine, "_initialize_rules_to_run", None)
    if len(type(machine).profiles) < 2 or not isinstance(waiting, list):
        return
    first = [r for r in waiting if getattr(r.function, "__name__", "") == "use_profile"]
    if first:
        setattr(machine, _HELD, [r for r in waiting if r not in first])
        waiting[:] = first


def release_initializers(machine: CrashStateMachine) -> None:
    """The profile is drawn: the user's @initialize rules may run now."""
    held = machine.__dict__.pop(_HELD, None)
    waiting = getattr(machine, "_initialize_rules_to_run", None)
    if held and isinstance(waiting, list):
        waiting.extend(held)


def reporting() -> bool:
    """Whether this failure will be shown: outside Hypothesis, or its final replay.

    Cause analysis re-runs recovery once per unsynced operation; while
    Hypothesis is still shrinking, nobody reads the message.
    """
    try:
        from hypothesis.control import current_build_context

        return bool(current_build_context().is_final)
    except Exception:  # no build context: called directly, always shown
        return True
