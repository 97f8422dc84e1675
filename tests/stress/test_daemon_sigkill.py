"""50 SIGKILL-and-restart cycles of the real daemon under load (``--run-stress``).

The campaign (workload, ledger, checks) lives in
tests/integration/test_daemon_crash_campaign.py, whose short run is in the default
tests; this is the long one, as ten items of five cycles, each on its own root
with its own seed, so ``pytest -n N`` spreads it (with five items of ten an item
cost 2.8-7.1 CPU s). Its restarts are forked off one interpreter that imported the
daemon, and an item's pauses before its kills are drawn in strata, so they add up to
about the same (docs/benchmarks.md, the twelfth pass). Not finer: a root needs a
history of several kills. The catalog's
``no_cascade_on_recovery`` (a cut-short cascade left unfinished) was killed by
these ten items (twice of two runs) and by the five of ten cycles (at a root's
fourth kill), and survived a run of 25 items of two cycles.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.daemon_forks import DaemonForks

CYCLES = 50
SHARDS = 10


@functools.cache  # loaded once: ten items run its function
def _campaign() -> ModuleType:
    path = Path(__file__).parents[1] / "integration" / "test_daemon_crash_campaign.py"
    spec = importlib.util.spec_from_file_location("substrat_sigkill_campaign", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def forks() -> Iterator[DaemonForks]:
    """One process to fork the daemons off for the items a worker runs: its start (an
    interpreter importing the daemon, 0.15-0.3 CPU s) was an item's before."""
    with DaemonForks() as started:
        yield started


@pytest.mark.stress
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("shard", range(SHARDS))
def test_fifty_sigkills_under_load(tmp_path: Path, shard: int, forks: DaemonForks) -> None:
    seed = int(os.environ.get("SUBSTRAT_SIGKILL_SEED", "20261125")) + shard
    cycles = CYCLES // SHARDS
    stats = _campaign().run_campaign(
        tmp_path / "root", cycles=cycles, workers=3, seed=seed, max_run_s=1.0, forks=forks
    )
    print(f"sigkill stress (seed {seed}): {stats}")
    assert stats.problems == []
    assert stats.failed_starts == 0
    assert stats.cycles == cycles
    assert stats.acked > 20, "the workload did too little to mean anything"
