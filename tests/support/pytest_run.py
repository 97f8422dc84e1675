"""pytest in a child process: another project's test run, or a second test process."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from tests.support.unicode_tables import give_unicode_tables
from tests.support.unused_plugins import OTHER_PROJECTS_PLUGINS, turned_off

CHILD_TIMEOUT_S = 240.0
"""How long a child pytest may take: a few small tests on a busy 2-core machine.

It was 120 s. A newcomer's main job at load 18 (seed 29220, 44 minutes) failed a child
test that passes alone in 12 s at load 4; a child slower than 120 s there is the likely
cause (unconfirmed: that run kept no output). Kept under pytest-timeout's 300 s, so a
child that hangs still fails its test naming the child's command."""


def run_pytest(
    cwd: Path,
    *args: str,
    env: Mapping[str, str] | None = None,
    timeout_s: float = CHILD_TIMEOUT_S,
    safe_path: bool = False,
    plugins_off: tuple[str, ...] = OTHER_PROJECTS_PLUGINS,
) -> subprocess.CompletedProcess[str]:
    """``python -m pytest -q -p no:cacheprovider ARGS`` in ``cwd``, its output captured.

    ``safe_path`` runs Python with ``-P``, so a directory in ``cwd`` cannot shadow an
    installed package. The installed plugins ``plugins_off`` are not loaded (by default
    other projects' ones, which these runs' tests do not use: a quarter of a start's CPU).
    The child gets this run's Hypothesis Unicode tables (tests/support/unicode_tables.py).
    """
    give_unicode_tables(cwd)
    python = [sys.executable, "-P"] if safe_path else [sys.executable]
    return subprocess.run(
        [*python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *turned_off(plugins_off), *args],
        cwd=cwd,
        env=None if env is None else dict(env),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
