"""pytest plugin loaded (``-p oracle._mutant_guard``) into each run of :mod:`oracle.mutants`.

Two jobs:

* prove that the run tests the planted copy: ``substrat`` must be imported from
  the mutant's temporary directory, else the run stops with a usage error (a
  run that silently tested the working tree would report a real bug as killed
  or survived for the wrong reason);
* record, as JSON lines, which tests failed and why, so the runner can name the
  test that killed the mutant without parsing pytest's text output;
* skip Hypothesis's shrink phase: a mutant needs one failing example, not the
  smallest one, and shrinking a stateful example can take minutes;
* tell a real kill from a harness error (:func:`classify`): a failure counts as
  a kill only when a durability or recovery check failed. The run stops at the
  first real kill (so a mutant costs only the tests up to its killer) and goes
  on past harness errors, which the runner reports separately; a test failing
  on an exception (``raised``) stops the run too.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

# Imported now, while pytest is still parsing its options: once the initial
# conftest files load, the repository root is put first on sys.path and an
# import of substrat from then on would find the working tree.
import substrat

DIR_ENV = "SUBSTRAT_MUTANT_DIR"
REPORT_ENV = "SUBSTRAT_MUTANT_REPORT"
MAX_MESSAGE_CHARS = 400

REAL, HARNESS, RAISED = "check", "harness", "raised"
CHECK_ERRORS = frozenset({"AssertionError", "OracleViolation", "ExploreFailed"})
"""Exception types that the checks raise: the contracts (tests/support/durability.py),
the oracle (oracle.checks, oracle.model), ``faultfs.explore``'s report and the tests'
own asserts on recovered state."""
HARNESS_MESSAGE = re.compile(
    r"crash point was not reached|never hit|I/O boundaries|boundary counts"
    r"|\.boundaries\b|\.images_checked\b|\.images_reused\b|\.states\b"
)
"""Assertions about the test harness itself (a crash point that moved, a changed
boundary or image count): they fail when a mutant changes the number of writes,
whether or not anything durable is lost, so they are no kill."""


def classify(exc_type: str, message: str) -> str:
    """``check`` when a durability or recovery check failed, ``harness`` when an
    assertion about the harness did, ``raised`` when a test failed on an exception
    instead (the code under test raised, say a file it needs is missing, or a
    test's look at the recovered state did, say an agent recovery lost): a
    detection, but not one a durability check made."""
    if exc_type == "Failed" and "DID NOT RAISE" in message:
        return HARNESS  # pytest.raises around an injected crash that never came
    if exc_type not in CHECK_ERRORS:
        return RAISED
    if exc_type == "AssertionError" and HARNESS_MESSAGE.search(message):
        return HARNESS
    return REAL


def _record(item: dict[str, Any]) -> None:
    path = os.environ.get(REPORT_ENV)
    if not path:
        return
    line = (json.dumps(item) + "\n").encode()
    # One O_APPEND write per record: xdist workers may report at the same time.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


@pytest.hookimpl(trylast=True)  # after the project has loaded its Hypothesis profile
def pytest_configure(config: pytest.Config) -> None:
    expected = os.environ.get(DIR_ENV)
    if not expected:
        raise pytest.UsageError(f"{__name__} is for oracle.mutants runs only ({DIR_ENV} unset)")
    where = Path(substrat.__file__).resolve()
    if not where.is_relative_to(Path(expected).resolve()):
        raise pytest.UsageError(
            f"substrat was imported from {where}, not from the planted copy under {expected}; "
            "something put the working tree ahead of PYTHONPATH on sys.path"
        )
    _record({"kind": "configured", "substrat": str(where)})
    _skip_shrinking()


def _skip_shrinking() -> None:
    from hypothesis import Phase, settings

    current = settings.default
    assert current is not None
    settings.register_profile(
        "substrat-mutant",
        parent=current,
        phases=[phase for phase in current.phases if phase is not Phase.shrink],
    )
    settings.load_profile("substrat-mutant")


def _message(report: pytest.TestReport | pytest.CollectReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = getattr(crash, "message", None) or str(report.longrepr)
    return text.strip()[:MAX_MESSAGE_CHARS]


def _exception_type(call: pytest.CallInfo[None]) -> str:
    if call.excinfo is None:
        return ""
    # Hypothesis reports several distinct failures as one group; any check among them counts.
    exc = call.excinfo.value
    inner = getattr(exc, "exceptions", None)
    if isinstance(exc, BaseExceptionGroup) and inner:
        names = [type(e).__name__ for e in inner]
        return next((n for n in names if n in CHECK_ERRORS), names[0])
    return call.excinfo.typename


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if not report.failed:
        return
    exc_type = _exception_type(call)
    message = _message(report)
    check = classify(exc_type, message)
    _record(
        {
            "kind": "failed",
            "nodeid": report.nodeid,
            "when": report.when,
            "exception": exc_type,
            "check": check,
            "message": message,
        }
    )
    if check != HARNESS:  # a harness failure says nothing: go on looking for a check
        item.session.shouldstop = f"mutant {check} at {report.nodeid}"


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _record({"kind": "collect_error", "nodeid": report.nodeid, "message": _message(report)})
