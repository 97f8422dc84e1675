"""substrat's own pytest configuration: the stress gate and the Hypothesis profiles.

Not registered by installing the distribution: a project that installs
substrat keeps its own ``stress`` marker, ``--run-stress`` and Hypothesis
settings. substrat's test suite loads it from its rootdir ``conftest.py``;
another project opts in with ``-p oracle.pytest_plugin`` (or ``addopts``).

Profiles (chosen by ``HYPOTHESIS_PROFILE``):

* ``default``: 200 examples, 30 stateful steps, no deadline (local runs).
* ``ci``: derandomized, 50 examples, 30 steps, no deadline. Hypothesis loads a
  profile named ``ci`` on its own when the ``CI`` variable is set; registering
  ours under that name means ours is the one that runs.
* ``nightly``: 5000 examples, 50 steps, no deadline.

``default`` and ``nightly`` keep their corpus where :mod:`oracle.corpus` says
(``.hypothesis/examples``, shared through Redis when ``HYPOTHESIS_REDIS_URL``
is set). ``ci`` has none: Hypothesis ties ``derandomize=True`` to no database.
"""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
from types import FrameType, TracebackType
from typing import Any

import pytest

try:
    from hypothesis import HealthCheck, settings
    from hypothesis.errors import InvalidArgument
except ImportError:  # `-p oracle.pytest_plugin` in a project without Hypothesis
    raise ImportError(
        "oracle.pytest_plugin (substrat's --run-stress gate and Hypothesis profiles) builds "
        "on Hypothesis, which is not installed: pip install hypothesis"
    ) from None

from oracle import fuzz_budget
from oracle.corpus import example_database
from oracle.local_constants import import_project_modules

STRESS_MARK = "stress"
STRESS_TEST_TIMEOUT_S = 1800
"""Per-test cap of a stress test when pytest gets no ``--timeout`` (as ci/stress.sh).

The project's ``timeout`` (300 s) guards the quick tests against hangs; the
fuzzers of the ``default`` and ``nightly`` profiles legitimately run longer on
a busy 2-core machine (the OpenAI crash fuzzer took over 300 s there)."""
_SKIP_REASON = "stress test: pass --run-stress to run the crash-recovery campaign"

_CORPUS = example_database()

settings.register_profile(
    "default",
    database=_CORPUS,
    max_examples=200,
    stateful_step_count=30,
    deadline=None,
)
settings.register_profile(
    "ci",
    derandomize=True,
    max_examples=50,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "nightly",
    database=_CORPUS,
    max_examples=5000,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


NOT_CI = frozenset({"0", "false", "no", "off"})
"""Values of ``CI`` that say "not CI" (a ``CI=false`` used to select the ``ci`` profile)."""


def selected_profile() -> str:
    """The profile this run uses: ``HYPOTHESIS_PROFILE``, else ``ci`` under CI."""
    explicit = os.environ.get("HYPOTHESIS_PROFILE")
    if explicit:
        return explicit
    ci = os.environ.get("CI", "").strip().lower()
    return "ci" if ci and ci not in NOT_CI else "default"


def _load_selected_profile() -> None:
    name = selected_profile()
    try:
        settings.load_profile(name)
    except InvalidArgument:
        # Hypothesis's own message names neither the variable nor the profiles there are.
        raise pytest.UsageError(
            f"HYPOTHESIS_PROFILE={name!r} is not a Hypothesis profile: substrat's are"
            " default (local runs), ci (derandomized, the PR gate) and nightly (the long"
            " campaign); set one of them, or unset HYPOTHESIS_PROFILE"
        ) from None


_load_selected_profile()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("substrat")
    group.addoption(
        "--run-stress",
        action="store_true",
        default=False,
        help="run tests marked 'stress' (crash-recovery fuzzers, sweeps, long SIGKILL runs)",
    )
    group.addoption(
        "--fuzz-budget",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stress fuzzers draw no new example once SECONDS have passed since the session"
        f" started, nor once a test has used {fuzz_budget.CAP_SHARE:.0%} of its per-test cap;"
        " a test stopped so passes and the summary says after how many examples"
        " (oracle/fuzz_budget.py; ci/nightly.sh's NIGHTLY_BUDGET_S)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{STRESS_MARK}: long crash-recovery fuzzing; needs --run-stress"
    )
    # Its hooks exist only with pytest-timeout; implementing them without it is an error.
    if config.pluginmanager.hasplugin("timeout"):
        config.pluginmanager.register(StressTimer(), "substrat-stress-timer")
    # Blocked (`-p no:substrat-project-imports`): pytest registers nothing and says nothing.
    config.pluginmanager.register(ProjectImports(), PROJECT_IMPORTS)
    _configure_fuzz_budget(config)


def _configure_fuzz_budget(config: pytest.Config) -> None:
    budget_s = config.getoption("--fuzz-budget")
    if budget_s is None:
        return
    if not budget_s > 0:  # also refuses nan
        raise pytest.UsageError(
            f"--fuzz-budget must be a positive number of seconds, got {budget_s:g}"
        )
    unsupported = fuzz_budget.check_supported()
    if unsupported:
        raise pytest.UsageError(
            f"--fuzz-budget cannot stop this Hypothesis's fuzzers: {unsupported}."
            " Run without --fuzz-budget (NIGHTLY_BUDGET_S=0 for ci/nightly.sh) or install a"
            " Hypothesis this project supports; see oracle/fuzz_budget.py"
        )
    budget = fuzz_budget.FuzzBudget(config, budget_s, STRESS_MARK)
    budget.install()
    config.pluginmanager.register(budget, "substrat-fuzz-budget")
    config.add_cleanup(budget.uninstall)


class StressTestTimeout(Exception):
    """A stress test ran past its per-test cap (pytest-timeout's ``--timeout``).

    Replaces pytest-timeout's ``pytest.fail("Timeout ...")`` for stress tests. Hypothesis
    takes that ``Failed`` for a failing example: it replays the example to shrink it, the
    replay ends before the cap, and the test failed as ``FlakyStrategyDefinition``
    ("Inconsistent data generation!") or ``FlakyFailure``, a strategy bug that is not
    there, with "Timeout" in one traceback line of the log.
    """


class _CapReached(KeyboardInterrupt):
    """What the alarm raises inside the test: the one exception Hypothesis stops on.

    Any other exception, BaseExceptions included, Hypothesis records as the example's
    outcome on the way out, which ends in ``FlakyStrategyDefinition`` just the same; a
    KeyboardInterrupt it passes through untouched and saves nothing. pytest would end
    the whole session on it, so :class:`StressTimer` turns it into
    :class:`StressTestTimeout` as it leaves the test phase.
    """


def _with_line_numbers(tb: TracebackType | None) -> TracebackType | None:
    """``tb`` without the entries that have no line number.

    The alarm can land where CPython records none (``tb_lineno`` None), and pytest's
    report of such a traceback fails with a TypeError: an INTERNALERROR that ended the
    session instead of one test failing (seen in 1 of 24 runs at a load of 8).
    """
    kept = []
    while tb is not None:
        if tb.tb_lineno is not None:
            kept.append(tb)
        tb = tb.tb_next
    rebuilt = None
    for entry in reversed(kept):
        rebuilt = TracebackType(rebuilt, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return rebuilt


class StressTimer:
    """pytest-timeout's signal timer for stress tests, raising :class:`StressTestTimeout`.

    An exception raised by a signal handler is lost when the signal lands in a
    garbage-collector callback (Hypothesis installs one): Python prints it as
    "Exception ignored" and the test goes on. pytest-timeout's own Failed was lost
    that way (a test capped at 3 s passed after 35 s), so the alarm here fires again
    every second until the exception has left a test phase, and only inside one.
    """

    def __init__(self) -> None:
        self._in_phase = False
        self._expired = False

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Any:
        return (yield from self._phase())

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Any:
        return (yield from self._phase())

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Any:
        return (yield from self._phase())

    def _phase(self) -> Any:
        self._in_phase = True
        try:
            return (yield)
        except _CapReached as reached:
            self._expired = True  # it got out: no second alarm in a later phase
            timeout = StressTestTimeout(str(reached))
            raise timeout.with_traceback(_with_line_numbers(reached.__traceback__)) from None
        finally:
            self._in_phase = False

    @pytest.hookimpl
    def pytest_timeout_set_timer(self, item: pytest.Item, settings: Any) -> bool | None:
        if STRESS_MARK in item.keywords and settings.timeout:
            # for --fuzz-budget: a fuzzer stops drawing examples well before this cap
            item.stash[fuzz_budget.CAP_STARTED] = (time.monotonic(), settings.timeout)
        if (
            STRESS_MARK not in item.keywords
            or settings.method != "signal"
            or threading.current_thread() is not threading.main_thread()
        ):
            return None  # pytest-timeout's own timer
        cap = settings.timeout
        self._expired = False

        def expire(signum: int, frame: FrameType | None) -> None:
            if self._expired:
                return
            signal.setitimer(signal.ITIMER_REAL, 1.0)  # again, in case this one is lost
            if not self._in_phase:
                return
            raise _CapReached(
                f"{item.nodeid} ran past its per-test cap of {cap:g} s (pytest --timeout;"
                " NIGHTLY_TEST_TIMEOUT_S in ci/nightly.sh, STRESS_TEST_TIMEOUT_S in"
                " ci/stress.sh). A fuzzer stopped here ran fewer examples than its profile"
                " asks; that is a time limit, not a failing example (none was saved to"
                " the corpus): raise the cap, split the run into more shards, or stop the"
                " fuzzers in time with --fuzz-budget (docs/ci.md, When time runs out)."
            )

        def cancel() -> None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, signal.SIG_DFL)

        item.cancel_timeout = cancel  # type: ignore[attr-defined]  # pytest-timeout calls it
        signal.signal(signal.SIGALRM, expire)
        signal.setitimer(signal.ITIMER_REAL, cap)
        return True


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-stress"):
        # An explicit --timeout wins; a test's own timeout marker too.
        if config.pluginmanager.hasplugin("timeout") and config.getoption("timeout") is None:
            cap = pytest.mark.timeout(STRESS_TEST_TIMEOUT_S)
            for item in items:
                if STRESS_MARK in item.keywords and item.get_closest_marker("timeout") is None:
                    item.add_marker(cap)
        return
    skip = pytest.mark.skip(reason=_SKIP_REASON)
    for item in items:
        if STRESS_MARK in item.keywords:
            item.add_marker(skip)


PROJECT_IMPORTS = "substrat-project-imports"
"""The name :class:`ProjectImports` is registered under: ``-p no:substrat-project-imports``
turns it off, for a run whose tests draw nothing their assertions tie to the pool (the
throw-away projects substrat's own tests run the CI scripts in, tests/support/ci_project.py)."""

_PROJECT_MODULES_IMPORTED = False


class ProjectImports:
    """Before this process's first test, import every project module (see oracle.local_constants).

    Here and not at start-up: an xdist controller runs no test and pays nothing. A plugin
    of its own, so that a run can turn it off by name (:data:`PROJECT_IMPORTS`): it costs
    about half a CPU second a process, and the pool it evens out matters only where a
    test's outcome depends on the examples drawn.
    """

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        global _PROJECT_MODULES_IMPORTED
        if not _PROJECT_MODULES_IMPORTED:
            _PROJECT_MODULES_IMPORTED = True
            import_project_modules()


def pytest_report_header(config: pytest.Config) -> str:
    stress = "on" if config.getoption("--run-stress") else "off (pass --run-stress)"
    return f"substrat: hypothesis profile={selected_profile()}, stress={stress}"


def pytest_sessionfinish(session: pytest.Session) -> None:
    """On a pytest-xdist worker, free the last tests' cyclic garbage now.

    After a worker reports its session finished, execnet gives it 5 s to end and then
    interrupts it (SIGINT). pytest's own clean-up runs a full garbage collection in that
    time, and after the crash fuzzer and the sweep a worker holds about 3 million
    objects of cyclic garbage: that collection took 5-6 s, the interrupt landed inside
    Hypothesis's garbage-collector callback, and the run ended with a
    ``PytestUnraisableExceptionWarning: KeyboardInterrupt``. Collected here, before
    xdist's hook wrapper reports the worker finished, nothing is timed.
    """
    if hasattr(session.config, "workerinput"):
        gc.collect()
