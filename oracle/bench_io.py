"""The I/O rows of the benchmark table: ``EventLog.log`` against a raw write+fsync (and
against itself before issue 15), and faultfs against pyfakefs and the real file system."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from oracle.bench_table import Row

LOG_APPENDS = 300
LOG_BEFORE_REV = "8db2e09e151f40048b632b5e330c27d504e4a860"
"""main just before issue 15: ``EventLog.log`` fsynced its pending copy too (two fsyncs)."""
FAULTFS_ROUNDS = 7


def eventlog_at(rev: str) -> ModuleType | None:
    """``substrat.eventlog`` as of ``rev``, loaded beside today's package (its imports are
    today's ``substrat``); None when git cannot show that revision (a shallow clone)."""
    top = Path(__file__).resolve().parents[1]
    shown = subprocess.run(
        ["git", "-C", str(top), "show", f"{rev}:substrat/eventlog.py"], capture_output=True
    )
    if shown.returncode != 0:
        print(f"EventLog at {rev} unavailable: {shown.stderr.decode().strip()}", file=sys.stderr)
        return None
    name = f"substrat_eventlog_{rev[:8]}"
    with tempfile.TemporaryDirectory(prefix="substrat-old-eventlog-") as tmp:
        path = Path(tmp) / f"{name}.py"
        path.write_bytes(shown.stdout)
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return module


def log_cost(
    appends: int = LOG_APPENDS, seed: int = 0, before_rev: str | None = LOG_BEFORE_REV
) -> tuple[float, float, float | None]:
    """Median microseconds of ``EventLog.log``, of a raw write+fsync of its bytes, and of
    ``EventLog.log`` as of ``before_rev`` (None when that revision is unavailable).

    Each round runs them in a shuffled order: run back to back in a fixed order, an
    fsync right after another one is cheaper and skews the ratio.
    """
    from substrat.eventlog import EventLog, encode_entry

    data = {"turn_id": "t12", "prompt": "summarise the design document in three bullet points"}
    line = encode_entry(
        {"seq": 1, "session_id": "s" * 32, "ts": "t" * 32, "event": "turn.start", "data": data}
    )
    old = None if before_rev is None else eventlog_at(before_rev)
    rng = random.Random(seed)
    samples: dict[str, list[float]] = {"log": [], "raw": [], "before": []}
    context = {"session_id": "s" * 32}
    with tempfile.TemporaryDirectory(prefix="substrat-logcost-", dir=os.getcwd()) as tmp:
        folder = Path(tmp)
        for sub in ("now", "before"):
            (folder / sub).mkdir()
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
        raw_fd = os.open(folder / "raw.jsonl", flags, 0o600)

        def raw() -> None:
            os.write(raw_fd, line)
            os.fsync(raw_fd)

        with contextlib.ExitStack() as stack:
            log = stack.enter_context(EventLog(folder / "now" / "events.jsonl", context))
            runs: dict[str, Callable[[], object]] = {
                "log": lambda: log.log("turn.start", data),
                "raw": raw,
            }
            if old is not None:
                old_path = folder / "before" / "events.jsonl"
                old_log = stack.enter_context(old.EventLog(old_path, context))
                runs["before"] = lambda: old_log.log("turn.start", data)
            for _ in range(appends):
                order = list(runs)
                rng.shuffle(order)
                for name in order:
                    started = time.perf_counter()
                    runs[name]()
                    samples[name].append(time.perf_counter() - started)
        os.close(raw_fd)
    logged, rawed = (statistics.median(samples[k]) * 1e6 for k in ("log", "raw"))
    before = statistics.median(samples["before"]) * 1e6 if samples["before"] else None
    return logged, rawed, before


def log_rows(before_rev: str = LOG_BEFORE_REV) -> list[Row]:
    """The EventLog.log rows: today's cost, and the cost before issue 15 (when git can
    show ``before_rev``), each against a raw write+fsync of the same bytes measured in
    the same rounds."""
    logged_us, raw_us, before_us = log_cost(before_rev=before_rev)
    raw_name = "raw write+fsync of the same bytes"
    rows = [
        Row(
            "EventLog.log (median)",
            logged_us,
            "us",
            raw_name,
            raw_us,
            higher_is_better=False,
            target="<= 2.2x",
            met=logged_us <= 2.2 * raw_us,
        )
    ]
    if before_us is not None:
        rows.append(
            Row(
                f"EventLog.log at {before_rev[:8]}, before issue 15 (pending copy fsynced too)",
                before_us,
                "us",
                raw_name,
                raw_us,
                higher_is_better=False,
            )
        )
    return rows


def _fs_workload(root: str, iterations: int = 100) -> int:
    """An fsynced append log plus atomic JSON rewrites; returns the os calls made."""
    calls = 1
    log = os.path.join(root, "events.jsonl")
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for i in range(iterations):
        os.write(fd, json.dumps({"n": i, "kind": "event"}).encode() + b"\n")
        os.fsync(fd)
        calls += 2
        if i % 10 == 0:
            tmp = os.path.join(root, "state.json.tmp")
            tfd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.write(tfd, json.dumps({"last": i}).encode())
            os.fsync(tfd)
            os.close(tfd)
            os.replace(tmp, os.path.join(root, "state.json"))
            dfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
            os.fsync(dfd)
            os.close(dfd)
            os.stat(log)
            os.listdir(root)
            calls += 11
    os.close(fd)
    return calls + 1


def _median_rate(run: Callable[[int], int], rounds: int) -> float:
    """Calls per second, the median over ``rounds`` runs (not the best: that flatters)."""
    rates = []
    for index in range(rounds):
        started = time.perf_counter()
        calls = run(index)
        rates.append(calls / (time.perf_counter() - started))
    return statistics.median(rates)


def faultfs_rates(rounds: int = FAULTFS_ROUNDS) -> tuple[float, float | None, float]:
    """os calls per second on faultfs, on pyfakefs alone (None if absent) and on disk."""
    from faultfs import FaultFS

    def on_faultfs(index: int) -> int:
        with FaultFS("/faultfs-bench"):
            return _fs_workload("/faultfs-bench")

    faultfs_rate = _median_rate(on_faultfs, rounds)
    pyfakefs_rate: float | None = None
    try:
        from pyfakefs.fake_filesystem_unittest import Patcher
    except ImportError:
        pass
    else:
        with Patcher():

            def on_pyfakefs(index: int) -> int:
                os.makedirs(f"/pyfakefs-bench/{index}")
                return _fs_workload(f"/pyfakefs-bench/{index}")

            pyfakefs_rate = _median_rate(on_pyfakefs, rounds)
    with tempfile.TemporaryDirectory(prefix="substrat-realfs-", dir=os.getcwd()) as tmp:

        def on_disk(index: int) -> int:
            folder = Path(tmp) / str(index)
            folder.mkdir()
            return _fs_workload(str(folder))

        real_rate = _median_rate(on_disk, 3)
    return faultfs_rate, pyfakefs_rate, real_rate


def faultfs_rows() -> list[Row]:
    """faultfs's os calls per second against pyfakefs alone and the real file system."""
    faultfs_rate, pyfakefs_rate, real_rate = faultfs_rates()
    name = "faultfs os calls/s"
    return [
        Row(name, faultfs_rate, "/s", "pyfakefs alone", pyfakefs_rate),
        Row(name, faultfs_rate, "/s", "real file system (fsync)", real_rate),
    ]
