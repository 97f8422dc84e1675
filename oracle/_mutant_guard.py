"""pytest plugin loaded (``-p oracle._mutant_guard``) into each run of :mod:`oracle.mutants`.

Two jobs:

* prove that the run tests the planted copy: ``substrat`` must be imported from
  the mutant's temporary directory, else the run stops with a usage error (a
  run that silently tested the working tree would report a real bug as killed
  or survived for the wrong reason);
* record, as JSON lines, which tests failed and why, so the runner can name the
  test that killed the mutant without parsing pytest's text output.
"""

from __future__ import annotations

import json
import os
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


def _message(report: pytest.TestReport | pytest.CollectReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = getattr(crash, "message", None) or str(report.longrepr)
    return text.strip()[:MAX_MESSAGE_CHARS]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.failed:
        _record(
            {
                "kind": "failed",
                "nodeid": report.nodeid,
                "when": report.when,
                "message": _message(report),
            }
        )


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _record({"kind": "collect_error", "nodeid": report.nodeid, "message": _message(report)})
