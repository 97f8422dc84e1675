"""A campaign spreads: machines run as shards (oracle.shards); item CPU times (oracle.item_cpu)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule

from oracle.item_cpu import load, spread, tails
from oracle.shards import examples_per_shard, run_shard
from tests.support.unused_plugins import PYTEST_ARGS

REPO = Path(__file__).resolve().parents[2]


class Recorder(RuleBasedStateMachine):
    """Records what each example draws, per class."""

    drawn: list[int]

    @rule(n=st.integers(0, 10**9))
    def draw(self, n: int) -> None:
        type(self).drawn.append(n)


@pytest.fixture
def derandomized() -> Iterator[None]:
    previous = settings._current_profile
    settings.register_profile("test-shards-ci", derandomize=True, max_examples=8, database=None)
    settings.load_profile("test-shards-ci")
    try:
        yield
    finally:
        settings.load_profile(previous or "default")


def test_shards_share_the_examples_rounding_up() -> None:
    assert examples_per_shard(4, settings(max_examples=50)) == 13
    assert examples_per_shard(1, settings(max_examples=50)) == 50
    assert examples_per_shard(64, settings(max_examples=50)) == 1


def test_derandomized_shards_draw_different_examples_and_repeat_them(derandomized: None) -> None:
    runs = []
    for shard in (0, 1, 0):
        Recorder.drawn = []
        run_shard(Recorder, shard, 2)
        runs.append(list(Recorder.drawn))
    assert runs[0] and runs[1]
    assert runs[0] == runs[2]  # reproducible
    assert runs[0] != runs[1]  # and not the same examples twice
    assert not hasattr(Recorder, "_hypothesis_internal_use_seed")  # the class is left alone


def test_spread_bound_and_greedy_schedule() -> None:
    s = spread({"a": 5.0, "b": 3.0, "c": 3.0}, 2)
    assert (s.total_s, s.longest_s, s.longest_item) == (11.0, 5.0, "a")
    assert s.bound_s == 5.5  # the total over two workers beats the longest item
    assert s.greedy_s == 6.0  # a alone, b and c on the other worker
    assert spread({"a": 5.0, "b": 3.0, "c": 3.0}, 64).greedy_s == 5.0


def test_item_cpu_lines_are_read_back_last_one_wins(tmp_path: Path) -> None:
    path = tmp_path / "items.jsonl"
    rows = [
        {"item": "t::a", "cpu_s": 1.0, "wall_s": 2.0},
        {"item": "t::a", "cpu_s": 3.0, "wall_s": 4.0},
        {"item": "t::b", "cpu_s": 0.5, "wall_s": 0.5},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert load(str(path)) == {"t::a": (3.0, 4.0), "t::b": (0.5, 0.5)}


def test_tails_are_each_workers_busy_span_and_idle_end(tmp_path: Path) -> None:
    path = tmp_path / "items.jsonl"
    rows = [
        {"item": "t::a", "pid": 1, "cpu_s": 1, "wall_s": 4, "start": 100.0, "end": 104.0},
        {"item": "t::b", "pid": 2, "cpu_s": 1, "wall_s": 1, "start": 100.5, "end": 101.5},
        {"item": "t::c", "pid": 2, "cpu_s": 1, "wall_s": 1, "start": 101.5, "end": 102.5},
        {"item": "t::old", "pid": 3, "cpu_s": 1, "wall_s": 1},  # an older run's line: no times
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert tails(str(path)) == {1: (4.0, 0.0), 2: (2.0, 1.5)}


def test_the_plugin_records_each_item(tmp_path: Path) -> None:
    (tmp_path / "test_x.py").write_text(
        "def test_one():\n    sum(range(10**5))\n\ndef test_two():\n    pass\n"
    )
    out = tmp_path / "cpu.jsonl"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "oracle.rewrite_scope",
            "-p",
            "oracle.item_cpu",
            "-p",
            "no:cacheprovider",
            "-q",
            "-p",
            "no:xdist",
            *PYTEST_ARGS,
            str(tmp_path / "test_x.py"),
        ],
        cwd=tmp_path,
        env={**os.environ, "SUBSTRAT_ITEM_CPU": str(out), "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    got = load(str(out))
    assert sorted(item.split("::")[1] for item in got) == ["test_one", "test_two"]
    assert all(cpu >= 0 and wall >= 0 for cpu, wall in got.values())
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(line["start"] <= line["end"] for line in lines)
    assert lines[0]["end"] <= lines[1]["start"]  # one worker: one item after the other


BURNER = """
import subprocess, sys

import pytest

BURN = (
    "import sys, time\\nfor _ in sys.stdin:\\n    t = time.process_time()\\n"
    "    while time.process_time() - t < 0.5:\\n        pass\\n    print('burnt', flush=True)\\n"
)


@pytest.fixture(scope="module")
def server():
    proc = subprocess.Popen([sys.executable, "-c", BURN], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    yield proc
    proc.stdin.close()
    proc.wait()


def test_burns(server):
    server.stdin.write("go\\n")
    server.stdin.flush()
    assert server.stdout.readline() == "burnt\\n"


def test_last(server):
    pass
"""


def test_a_live_helper_process_is_charged_to_the_item_it_worked_for(tmp_path: Path) -> None:
    # The module's server is reaped at the module's end, in the last item's teardown; the
    # half CPU second it burnt belongs to the item that asked for it.
    (tmp_path / "test_server.py").write_text(BURNER)
    out = tmp_path / "cpu.jsonl"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "oracle.item_cpu", "-p", "no:cacheprovider"]
        + ["-q", "-p", "no:xdist", *PYTEST_ARGS, str(tmp_path / "test_server.py")],
        cwd=tmp_path,
        env={**os.environ, "SUBSTRAT_ITEM_CPU": str(out), "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    got = {item.split("::")[1]: cpu for item, (cpu, _) in load(str(out)).items()}
    assert got["test_burns"] >= 0.4, got
    assert got["test_last"] < 0.3, got
