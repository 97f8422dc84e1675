"""A time budget for the stress fuzzers: stop drawing new examples in time, and say so.

``pytest --run-stress --fuzz-budget SECONDS`` (what ci/nightly.sh passes) bounds
each stress item's Hypothesis runs by wall time, twice over:

* the session's budget: no new example is drawn once SECONDS have passed since
  the session started (under xdist, since the controller started), so a shard of
  the nightly campaign ends before its job's ``timeout-minutes``;
* the item's cap: nor once the item has used :data:`CAP_SHARE` of its per-test
  cap (pytest-timeout's ``--timeout`` or marker), so no fuzzer reaches the cap
  and fails as a :class:`~oracle.pytest_plugin.StressTestTimeout`. The rest of
  the cap is for the example in flight and, if it found a bug, its shrinking.

An item stopped that way passes, with "stopped at budget after N of M examples"
in the session's summary (and in its report's sections): the examples it ran all
passed, and it did not run the others. A bug found before the budget ran out is
shrunk and reported as always, and saved to the example database when found.

How: Hypothesis asks its engine's ``ConjectureRunner.should_generate_more()``
before each new example of its generate phase (and of the target and mutation
passes inside it), and nowhere else; the explicit examples, the replay of the
corpus and the shrinking do not ask. Hypothesis has no public setting for a time
limit (its ``timeout`` setting was removed in 3.x), so while a budget is set the
method is wrapped: when the deadline has passed it answers no, as it does when
``max_examples`` is reached, and the run ends the way such a run ends. The
method is not public API; without it (a Hypothesis that renamed it) the option
stops the session at start-up with what to do, rather than running unbudgeted.
Without the option nothing is wrapped, so ``ci`` and ``default`` runs are as
before.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

import pytest

CAP_SHARE = 0.8
"""The share of an item's per-test cap after which it draws no new example."""

PROPERTY = "fuzz_budget"
"""The name of the user property (and report section) that says an item was stopped."""

CAP_STARTED = pytest.StashKey[tuple[float, float]]()
"""(monotonic time, seconds): when an item's per-test cap started, and how long it is;
set by oracle.pytest_plugin's timer."""

_WORKER_KEY = "substrat_fuzz_deadline"
"""The session deadline (Unix time) the xdist controller hands its workers."""

_FIRST_CALL = "_substrat_budget_first_call"
_STOPPED = "_substrat_budget_stopped"


@dataclass
class Stop:
    """One Hypothesis run stopped by the budget."""

    examples: int
    asked: int


@dataclass
class _Current:
    deadline: float | None = None  # monotonic; None: no budget for the running test
    stops: list[Stop] = field(default_factory=list)


_CURRENT = _Current()


def _runner_class() -> Any:
    from hypothesis.internal.conjecture.engine import ConjectureRunner

    return ConjectureRunner


def _valid_examples(runner: Any) -> int:
    # valid_test_cases since Hypothesis 6.16x, valid_examples before
    for name in ("valid_test_cases", "valid_examples"):
        count = getattr(runner, name, None)
        if isinstance(count, int):
            return count
    return int(runner.call_count)


def _budgeted(original: Callable[[Any], bool]) -> Callable[[Any], bool]:
    def should_generate_more(runner: Any) -> bool:
        if not original(runner):
            return False
        deadline = _CURRENT.deadline
        if deadline is None:
            return True
        # Hypothesis asserts this is true as its generate phase begins, and a run with no
        # valid example ends as Unsatisfiable: so at least one example is always drawn.
        first = runner.__dict__.setdefault(_FIRST_CALL, runner.call_count)
        if runner.call_count <= first or time.monotonic() < deadline:
            return True
        if not runner.__dict__.get(_STOPPED):
            runner.__dict__[_STOPPED] = True
            _CURRENT.stops.append(Stop(_valid_examples(runner), runner.settings.max_examples))
        return False

    should_generate_more.__wrapped__ = original  # type: ignore[attr-defined]
    return should_generate_more


def describe(stops: list[Stop], why: str) -> str:
    runs = "; ".join(f"after {s.examples} of {s.asked} examples" for s in stops)
    return f"stopped at budget {runs} ({why})"


class FuzzBudget:
    """The pytest side: sets each stress item's deadline and reports the items it stopped."""

    def __init__(self, config: pytest.Config, budget_s: float, mark: str) -> None:
        self._budget_s = budget_s
        self._mark = mark
        workerinput = getattr(config, "workerinput", None)
        if workerinput is not None and _WORKER_KEY in workerinput:
            deadline_unix = float(workerinput[_WORKER_KEY])
        else:
            deadline_unix = time.time() + budget_s
        self._deadline_unix = deadline_unix
        self._session_deadline = time.monotonic() + (deadline_unix - time.time())
        self._stopped: list[tuple[str, str]] = []
        self._runner = _runner_class()
        self._original = self._runner.should_generate_more

    def install(self) -> None:
        self._runner.should_generate_more = _budgeted(self._original)

    def uninstall(self) -> None:
        self._runner.should_generate_more = self._original

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """xdist's controller: one deadline for every worker, from the controller's start."""
        node.workerinput[_WORKER_KEY] = self._deadline_unix

    # Innermost: pytest-timeout starts a func_only cap in its own wrapper of this hook.
    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, Any, Any]:
        if self._mark not in item.keywords:
            return (yield)
        deadline = self._session_deadline
        why = f"the session's --fuzz-budget of {self._budget_s:g} s"
        started_cap = item.stash.get(CAP_STARTED, None)
        if started_cap is not None:
            started, cap = started_cap
            if started + CAP_SHARE * cap < deadline:
                deadline = started + CAP_SHARE * cap
                why = f"{CAP_SHARE:.0%} of its per-test cap of {cap:g} s"
        _CURRENT.deadline, _CURRENT.stops = deadline, []
        try:
            result = yield
        finally:
            stops, _CURRENT.deadline, _CURRENT.stops = _CURRENT.stops, None, []
        # only a test that passed: a failing one reports its failure, budget or not
        if stops:
            text = describe(stops, why)
            item.user_properties.append((PROPERTY, text))
            item.add_report_section("call", PROPERTY, text)
        return result

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call":
            return
        for name, value in report.user_properties:
            if name == PROPERTY:
                self._stopped.append((report.nodeid, str(value)))

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if hasattr(terminalreporter.config, "workerinput"):
            return
        terminalreporter.section("fuzz budget")
        if not self._stopped:
            terminalreporter.line(
                f"every fuzzer ran all its examples within the budget ({self._budget_s:g} s)"
            )
            return
        for nodeid, text in self._stopped:
            terminalreporter.line(f"{nodeid}: {text}")
        terminalreporter.line(
            f"{len(self._stopped)} stress test(s) stopped at budget: they passed on the"
            " examples they ran and did not run the rest"
        )


def check_supported() -> str | None:
    """Why ``--fuzz-budget`` cannot work with the installed Hypothesis, or None."""
    try:
        runner = _runner_class()
    except ImportError as error:  # pragma: no cover - Hypothesis moved its engine
        return f"Hypothesis's engine could not be imported ({error})"
    if not callable(getattr(runner, "should_generate_more", None)):
        return "Hypothesis's ConjectureRunner has no should_generate_more() any more"
    return None
