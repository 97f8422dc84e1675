"""Shared fixtures for substrat's own tests, and how xdist hands them out."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A fresh substrat root on the real file system."""
    path = tmp_path / "root"
    path.mkdir()
    return path


def dist_named(config: pytest.Config) -> bool:
    """Whether the command line (or PYTEST_ADDOPTS) chose an xdist ``--dist`` mode."""
    words = [*config.invocation_params.args, *shlex.split(os.environ.get("PYTEST_ADDOPTS", ""))]
    return any(w in ("--dist", "-d", "--distload") or w.startswith("--dist=") for w in words)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``-n N`` without a ``--dist``: xdist's work-stealing scheduler, not ``load``.

    ``load`` hands out the collection in chunks sized by what is left to send, so
    near the end one worker can hold a long run of real tests while the other
    has nothing left but instant ones: without ``--run-stress`` the last quarter
    of the collection is stress tests that skip, and in the default run one of
    two workers sat idle for the last 68-105 s of 300-555 (docs/benchmarks.md,
    issue 17's sixth pass). ``worksteal`` moves queued tests to an idle worker.
    An explicit ``--dist`` is left alone.
    """
    if config.getoption("dist") != "load" or dist_named(config):
        return None
    from xdist.scheduler import WorkStealingScheduling

    return WorkStealingScheduling(config, log)
