"""The benchmark's origin rows (oracle.bench_origin) count what they claim, and a baseline
revision that predates a measured function is n/a in one line (oracle.bench_fuzz)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path
from typing import Any

import pytest

from oracle import bench_fuzz
from oracle.bench_origin import Origin, origin_rate

FAKE_CRASH_FUZZ = '''
from hypothesis.stateful import RuleBasedStateMachine, rule
from .vfs import VirtualFS


class CrashRecoveryMachine(RuleBasedStateMachine):
    """Every step "crashes" once (a thaw), and arms three crashes of which two never fire."""

    def __init__(self):
        super().__init__()
        self.vfs = VirtualFS()

    @rule()
    def crash(self):
        for _ in range(3):
            self.vfs.arm(5)
        self.vfs.thaw()
'''

FAKE_VFS = """
THAWED = []


class VirtualFS:
    def arm(self, n):
        pass

    def thaw(self):
        THAWED.append(1)
"""


def _fake_origin(top: Path) -> Path:
    stress = top / "tests" / "stress"
    stress.mkdir(parents=True)
    (top / "tests" / "__init__.py").write_text("")
    (stress / "__init__.py").write_text("")
    (stress / "vfs.py").write_text(textwrap.dedent(FAKE_VFS))
    (stress / "test_crash_fuzz.py").write_text(textwrap.dedent(FAKE_CRASH_FUZZ))
    (stress / "test_orchestrator_fuzz.py").write_text("OrchestratorStateMachine = None\n")
    return top


def test_a_directory_that_is_no_checkout_of_the_origin_is_refused(tmp_path: Path) -> None:
    problem = Origin(tmp_path, sys.executable).check()
    assert problem is not None and "test_crash_fuzz.py" in problem
    assert Origin(_fake_origin(tmp_path / "origin"), sys.executable).check() is None


def test_the_origin_crash_rate_counts_crashes_that_happened_not_rules(tmp_path: Path) -> None:
    """A cycle is a thaw (the disk "rebooted" after a crash), not an armed crash rule:
    the probe's count divided by its CPU time, over the examples after the warm-up."""
    origin = Origin(_fake_origin(tmp_path / "origin"), sys.executable, min(os.sched_getaffinity(0)))
    probe_count = textwrap.dedent(
        """
        import sys
        from oracle import bench_origin
        from oracle.bench_origin import PROBE
        fuzz = bench_origin.__file__.replace("bench_origin.py", "bench_fuzz.py")
        sys.argv = ["probe", "crash", "4", "5", "1717", "0", fuzz]
        import tests.stress.vfs as vfs
        probe = {"__name__": "__main__"}
        exec(compile(PROBE, "probe", "exec"), probe)
        print(probe["count"][0], len(vfs.THAWED))
        """
    )
    counted = subprocess.run(
        [sys.executable, "-c", probe_count],
        capture_output=True,
        text=True,
        cwd=origin.path,
        env={**os.environ, "PYTHONPATH": str(Path(bench_fuzz.__file__).resolve().parents[1])},
        check=True,
    )
    rate, cycles, thawed = counted.stdout.split()
    # 4 examples of up to 5 steps; each step thawed once and armed three times
    assert int(cycles) == int(thawed) and 4 <= int(thawed) <= 20 and float(rate) > 0
    assert origin_rate(origin, "crash", 4, 5, 1717) is not None


def test_a_revision_that_predates_the_function_is_na_said_once(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = io.BytesIO()
    tarfile.open(fileobj=empty, mode="w").close()
    probes: list[list[str]] = []
    real_run = subprocess.run

    def run(argv: list[str], **kwargs: Any) -> Any:
        if argv[0] == "git":
            return subprocess.CompletedProcess(argv, 0, stdout=empty.getvalue(), stderr=b"")
        if argv[0] == "tar":
            return real_run(argv, **kwargs)
        probes.append(argv)
        stderr = (
            "Traceback (most recent call last):\n  File ...\n"
            "ImportError: cannot import name 'reply_header' from 'substrat.providers.scripted' "
            "(/tmp/substrat-baseline-x/substrat/providers/scripted.py)\n"
        )
        return subprocess.CompletedProcess(argv, 1, stdout="", stderr=stderr)

    monkeypatch.setattr(bench_fuzz.subprocess, "run", run)
    monkeypatch.setattr(bench_fuzz, "_UNAVAILABLE", {})
    assert bench_fuzz.on_revision("1fa8a458aaaa", "lifecycle_examples") is None
    assert bench_fuzz.on_revision("1fa8a458aaaa", "lifecycle_examples") is None
    said = capsys.readouterr().err.strip().splitlines()
    assert said == [
        "lifecycle_examples at 1fa8a458: n/a, the revision predates it (cannot import name "
        "'reply_header' from 'substrat.providers.scripted')"
    ]
    assert len(probes) == 1  # not run again in the next round


def _constant_rates(monkeypatch: pytest.MonkeyPatch, origin: dict[str, float]) -> None:
    from oracle import bench_origin

    rates = {
        "fuzz_cycles": 400.0,
        "hypothesis_cycles": 240.0,
        "hypothesis_cycles_50": 250.0,
        "lifecycle_examples": 40.0,
        "lifecycle_on_disk": 10.0,
        "lifecycle_engine_only": 200.0,
    }
    for name, rate in rates.items():
        monkeypatch.setattr(bench_fuzz, name, lambda rate=rate: rate)
    monkeypatch.setattr(bench_fuzz, "in_fresh_process", lambda name: rates[name])
    monkeypatch.setattr(bench_origin, "origin_rate", lambda _o, kind, *_a: origin[kind])


def test_without_the_origin_its_rows_cite_the_constants_and_say_how_to_measure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _constant_rates(monkeypatch, {})
    rows = bench_fuzz.fuzz_rows(None, rounds=1)
    cited = [r for r in rows if r.baseline_name.startswith("origin's")]
    assert [r.baseline for r in cited] == [
        bench_fuzz.ORIGIN_PERSISTENCE_FUZZER,
        bench_fuzz.ORIGIN_LIFECYCLE_FUZZER,
    ]
    assert all("--origin PATH" in r.baseline_name for r in cited)
    assert [r.met for r in cited] == [False, False]  # 240 < 340, 40 < 125


def test_with_the_origin_its_rows_hold_the_measured_rates_and_judge_the_ratio(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # ours 240 cycles/s at 30 steps against the origin's 242 at 50: 0.992x, just under
    # 340/342 (0.994x); ours at 50 steps 250: 1.03x; ours 40 examples/s against 26: 1.54x
    _constant_rates(monkeypatch, {"crash": 242.0, "lifecycle": 26.0})
    origin = Origin(tmp_path, sys.executable)
    rows = bench_fuzz.fuzz_rows(None, rounds=2, origin=origin)
    measured = [r for r in rows if r.baseline_name.startswith("origin's")]
    assert [r.baseline for r in measured] == [242.0, 242.0, 26.0]
    assert [r.figure for r in measured] == [240.0, 250.0, 40.0]
    assert "at the origin's 50 steps" in measured[1].measure
    assert all("this run" in r.baseline_name for r in measured)
    assert [r.met for r in measured] == [False, True, True]
    assert [r.target for r in measured] == [">= 0.99x (340/342)", ">= 0.99x", ">= 1.5x"]


def test_a_figure_of_ours_that_fails_in_its_fresh_process_stops_the_bench_saying_why() -> None:
    with pytest.raises(RuntimeError, match="no_such_rate failed in a fresh process") as raised:
        bench_fuzz.in_fresh_process("no_such_rate")
    assert "has no attribute 'no_such_rate'" in str(raised.value)
