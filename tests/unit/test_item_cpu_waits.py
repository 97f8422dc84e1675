"""oracle.item_cpu tells an item that waits from one that waited for a CPU.

On a loaded machine an item's wall time minus its CPU time is mostly time its process
was ready to run while other processes held the CPUs: every item looks like a waiter.
The plugin also records, from Linux's schedstat, how long the item's thread was blocked
(a sleep, a poll, a child process, the disk), which load does not add to.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from oracle import item_cpu
from tests.support.pytest_run import run_pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    not os.path.exists("/proc/thread-self/schedstat"), reason="Linux's schedstat only"
)

ITEMS = """
import time


def test_sleeps():
    time.sleep(0.4)


def test_computes():
    end = time.thread_time() + 0.3
    while time.thread_time() < end:
        pass
"""


def test_a_sleep_is_blocked_time_and_computing_is_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "test_items.py").write_text(ITEMS)
    out = tmp_path / "cpu.jsonl"
    env = {**os.environ, "SUBSTRAT_ITEM_CPU": str(out), "PYTHONPATH": str(REPO)}
    run = run_pytest(tmp_path, "-p", "oracle.item_cpu", "-p", "no:xdist", "test_items.py", env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = {json.loads(line)["item"].split("::")[1]: json.loads(line) for line in out.open()}
    sleeps, computes = rows["test_sleeps"], rows["test_computes"]
    assert sleeps["blocked_s"] >= 0.35, sleeps  # the scheduler's clock is not perf_counter
    # cpu_s comes from os.times, in clock ticks (10 ms here)
    assert computes["blocked_s"] < 0.2 and computes["cpu_s"] >= 0.25, computes
    for row in rows.values():  # wall = on a CPU + ready for one + blocked
        assert row["ready_s"] >= 0 and row["blocked_s"] + row["ready_s"] <= row["wall_s"], row

    blocked = item_cpu.blocked(str(out))
    assert blocked == {row["item"]: row["blocked_s"] for row in rows.values()}
    assert item_cpu.main([str(out)]) == 0
    said = capsys.readouterr().out
    assert f"blocked (neither on a CPU nor ready for one): {sum(blocked.values()):.1f} s" in said
    assert f"| `{sleeps['item']}` | {sleeps['blocked_s']:.1f} |" in said


def test_lines_without_it_are_left_out(tmp_path: Path) -> None:
    older = tmp_path / "older.jsonl"
    older.write_text(
        json.dumps({"item": "t::a", "pid": 1, "cpu_s": 1.0, "wall_s": 2.0})
        + "\n"
        + json.dumps({"item": "t::b", "pid": 1, "cpu_s": 1.0, "wall_s": 2.0, "blocked_s": 0.5})
        + "\n"
    )
    assert item_cpu.blocked(str(older)) == {"t::b": 0.5}
