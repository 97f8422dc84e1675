"""Power loss under the real daemon: LazyFS drops whatever was never fsynced.

``python -m oracle.powerloss --cycles 100`` (what ``ci/powerloss.sh`` runs).
Each cycle:

1. start the daemon (``python -m substrat.daemon --no-wake``) on a root whose
   state lives on a LazyFS mount, and wait until it answers ``ping``;
2. drive a random workload over RPC with :class:`oracle.daemon_driver.Driver`,
   which records every acknowledged operation in the oracle's model;
3. at a random moment cut the power: SIGKILL the daemon, then clear LazyFS's
   cache. In some cycles a LazyFS crash fault is armed instead, on one kind of
   operation on one kind of substrat file, and LazyFS dies at the next match.
   Unsynced bytes written to the mount just before must be gone after it
   (:mod:`oracle.powerloss_disk`): a cut that keeps them tested nothing;
4. remount (LazyFS's crash recovery: a lazy unmount, a fresh mount), recover
   the root offline and check it with :func:`oracle.checks.check_recovery`
   (every acknowledged operation present, the one in flight all or nothing,
   nothing else, the invariants); the next cycle's daemon must then serve
   exactly the state the oracle accepted.

LazyFS does not implement ``mknod``, so a Unix socket cannot be bound on it.
The daemon's root is therefore an ordinary directory (socket, lock, log) whose
state directories ``agents/``, ``user/`` and ``quarantine/`` are symbolic links
into the mount; substrat needs no option for it. docs/lazyfs.md has the
details and LazyFS's blind spot.

Only this module uses :mod:`faultfs.lazyfs`, and only when a campaign runs."""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from faultfs.errors import FaultFSError
from oracle.checks import expected
from oracle.daemon_driver import Driver, check_offline, check_served, lost_offline
from oracle.errors import OracleViolation
from oracle.losses import Lost
from oracle.model import Model
from oracle.powerloss_disk import (
    CANARY_NAME,
    LAZYFS_TIMEOUT_S,
    PlainDisk,
    canary_survived,
    lazyfs_unavailable_reason,
    leftover_campaigns,
    mount_first,
    tree_bytes,
    write_canary,
)
from oracle.powerloss_disk import Disk as _Disk
from oracle.powerloss_report import CycleResult, PowerLossReport
from substrat.client import DaemonProcess
from substrat.errors import DaemonError

DEFAULT_CYCLES = 100
DEFAULT_SEED = 20261125
DEFAULT_MAX_RUN_S = 1.0
MIN_RUN_S = 0.05
MIN_ACKS_PER_CYCLE = 5
"""A cut waits (up to MAX_WAIT_FOR_ACKS_S) until the cycle has this many acknowledgements."""
MAX_WAIT_FOR_ACKS_S = 30.0
DEFAULT_INJECT_PROBABILITY = 0.3
DEFAULT_CACHE_SIZE_BYTES = 64 * 1024 * 1024
DAEMON_START_TIMEOUT_S = 60.0
DAEMON_STOP_TIMEOUT_S = 30.0
DRIVER_JOIN_TIMEOUT_S = 45.0
INJECTION_FIRE_TIMEOUT_S = 5.0
# Recovery reads every log through LazyFS's cache, which cannot evict: past this share
# of the cache the campaign stops and asks for a bigger one instead of failing writes.
MAX_STATE_SHARE_OF_CACHE = 0.5
STATE_DIRS = ("agents", "user", "quarantine")
# (op, path regex, rename target regex): each names files substrat really touches.
CRASH_POINTS: tuple[tuple[str, str | None, str | None], ...] = (
    ("fsync", r"events\.jsonl$", None),
    ("fsync", r"events\.pending$", None),
    ("fsync", r"session\.json\.tmp$", None),
    ("write", r"events\.jsonl$", None),
    ("write", r"events\.pending$", None),
    ("write", r"session\.json\.tmp$", None),
    ("create", r"session\.json\.tmp$", None),
    ("create", r"events\.jsonl$", None),
    ("rename", None, r"session\.json$"),
)


# -- the campaign ----------------------------------------------------------------------------


class Campaign:
    """One campaign's disk, root, model and report (see :func:`run_campaign`)."""

    def __init__(
        self,
        disk: _Disk,
        root: Path,
        out_dir: Path,
        report: PowerLossReport,
        *,
        max_run_s: float,
        inject_probability: float,
        cache_size_bytes: int | None,
        after_cut: Callable[[Path], None] | None,
        log: Callable[[str], None],
        verify_cuts: bool = True,
    ) -> None:
        self.disk = disk
        self.root = root
        self.out_dir = out_dir
        self.report = report
        self.max_run_s = max_run_s
        self.inject_probability = inject_probability
        self.cache_size_bytes = cache_size_bytes
        self.after_cut = after_cut
        self.log = log
        self.verify_cuts = verify_cuts
        self.rng = random.Random(report.seed)
        self.model = Model()
        self.daemon: DaemonProcess | None = None
        self.driver: Driver | None = None

    def _daemon(self) -> DaemonProcess:
        # Kept before it starts, so that an interrupted start can still be killed.
        self.daemon = DaemonProcess(
            self.root, daemon_args=["--no-wake"], log_path=self.out_dir / "daemon.log"
        )
        return self.daemon.start(timeout_s=DAEMON_START_TIMEOUT_S)

    def stop_processes(self) -> None:
        """Kill the daemon and stop the driver, wherever the campaign was interrupted."""
        if self.driver is not None:
            self.driver.stop.set()
        if self.daemon is not None:
            self.daemon.kill()

    def cycle(self, index: int) -> bool:
        """Start, load, cut, remount, check. False when a problem stops the campaign.

        The cycle is counted in the report however it ends (a failed check, an
        exception): its acknowledged operations and what its check found lost.
        """
        result = CycleResult(str(index + 1))
        before = self.model.acked_ops
        try:
            result.ok = self._cycle(index, result)
            return result.ok
        finally:
            result.acknowledged = self.model.acked_ops - before
            self.report.record(result, self.model.acked_ops)

    def _cycle(self, index: int, result: CycleResult) -> bool:
        report = self.report
        daemon = self._daemon()
        driver = Driver(self.root, self.model, random.Random(self.rng.random()), index * 10**6)
        self.driver = driver
        fired = False
        canary = b""
        try:
            if index:
                problems, result.lost = check_served(self.root, self.model, after_crash=True)
                if problems:
                    report.problems += [f"cycle {index + 1}, served: {p}" for p in problems]
                    return False
            enough = self.model.acked_ops + MIN_ACKS_PER_CYCLE
            driver.start()
            time.sleep(self.rng.uniform(MIN_RUN_S, self.max_run_s))
            # On a loaded machine the random pause can end before any work is done:
            # cut only once the cycle has something to lose (the cut point stays random).
            deadline = time.monotonic() + MAX_WAIT_FOR_ACKS_S
            while (
                self.model.acked_ops < enough and driver.is_alive() and time.monotonic() < deadline
            ):
                _raise_if_signalled()
                time.sleep(0.01)
            if self.verify_cuts:
                canary = write_canary(self.disk.mount_dir, index)
            if self.rng.random() < self.inject_probability:
                fired = self._inject()
        finally:
            daemon.kill()
        if not fired:
            self.disk.clear_cache(LAZYFS_TIMEOUT_S)
            report.power_cuts += 1
        result.cut = "LazyFS crash fault" if fired else "SIGKILL + clear-cache"
        driver.stop.set()
        driver.join(DRIVER_JOIN_TIMEOUT_S)
        if driver.is_alive():
            raise RuntimeError(f"cycle {index}: the driver still runs {DRIVER_JOIN_TIMEOUT_S} s")
        if driver.error is not None:
            raise driver.error
        report.refused += driver.refused
        if driver.violation is not None:
            # An answer that does not continue the acknowledged history.
            first_line = str(driver.violation).splitlines()[0]
            result.lost.other.append(
                f"an answer contradicted the acknowledged history: {first_line}"
            )
            report.problems.append(f"cycle {index + 1}, acknowledged answer: {driver.violation}")
            return False
        if driver.unexpected is not None:
            if not fired:
                report.problems.append(f"cycle {index}: {driver.unexpected}")
                return False
            report.io_errors_after_lazyfs_crash += 1
        in_flight = self.model.crashed()
        result.in_flight = in_flight.describe() if in_flight is not None else ""
        self.disk.remount(LAZYFS_TIMEOUT_S)
        if canary:
            if canary_survived(self.disk.mount_dir, canary):
                report.problems.append(
                    f"cycle {index + 1}: the power cut dropped nothing: {len(canary)} bytes "
                    f"written to {CANARY_NAME} on the mount without an fsync just before the "
                    "cut were all still there after the remount, so no cut of this run tested "
                    "power loss. Is LAZYFS_BIN a LazyFS that drops its cache (docs/lazyfs.md)?"
                )
                return False
            report.cuts_verified += 1
        if self.after_cut is not None:
            self.after_cut(Path(self.disk.mount_dir))
        before = expected(self.model.state)
        try:
            state, recovery = check_offline(self.root, self.model)
        except OracleViolation as exc:
            report.problems.append(f"cycle {index + 1}, recovered: {exc}")
            result.lost = self._lost_offline()
            return False
        self.model.settle(state)
        if in_flight is not None:
            applied = expected(state) != before
            report.in_flight_at_cut += 1
            report.in_flight_applied += applied
            report.errored_but_applied += applied and driver.unexpected is not None
            result.in_flight = f"{'done' if applied else 'undone'}: {in_flight.describe()}"
        report.lost_turns_reported += len(recovery.get("lost_turns") or [])
        report.redelivered_reported += len(recovery.get("redelivered") or [])
        report.cycles += 1
        report.state_bytes = tree_bytes(Path(self.disk.mount_dir))
        limit = (self.cache_size_bytes or 0) * MAX_STATE_SHARE_OF_CACHE
        if limit and report.state_bytes > limit:
            report.problems.append(
                f"after cycle {index + 1} the state is {report.state_bytes >> 20} MiB, over "
                f"{MAX_STATE_SHARE_OF_CACHE:.0%} of LazyFS's cache ({self.cache_size_bytes} "
                "bytes), which cannot evict; raise --cache-mib for this many cycles"
            )
            return False
        flight = result.in_flight or "nothing in flight"
        cut = "LazyFS crash fault" if fired else "SIGKILL + clear-cache"
        self.log(
            f"cycle {index + 1}/{report.cycles_requested}: {cut}; {flight}; "
            f"{self.model.acked_ops} acknowledged so far"
        )
        return True

    def _lost_offline(self) -> Lost:
        try:
            return lost_offline(self.root, self.model)
        except Exception as exc:  # the report must still say that something was lost
            return Lost(other=[f"the recovered root could not be read back: {exc}"])

    def _inject(self) -> bool:
        """Arm a LazyFS crash fault and wait for it to fire; True if LazyFS died."""
        from faultfs.lazyfs import LazyFS, LazyFSError

        assert isinstance(self.disk, LazyFS)
        op, source, target = self.rng.choice(CRASH_POINTS)
        timing = self.rng.choice(["before", "after"])
        try:
            self.disk.crash(
                op=op,
                timing=timing,
                from_regex=source,
                to_regex=target,
                timeout_s=LAZYFS_TIMEOUT_S,
            )
        except LazyFSError:
            if not self.disk.crashed:  # it may fire before its acceptance is read
                raise
        deadline = time.monotonic() + INJECTION_FIRE_TIMEOUT_S
        while not self.disk.crashed and time.monotonic() < deadline:
            time.sleep(0.01)
        if self.disk.crashed:
            self.report.lazyfs_crashes += 1
            self.log(f"LazyFS crash fault fired: {timing} {op} {source or target}")
            return True
        self.report.injections_unfired += 1
        return False

    def finish(self) -> None:
        """A last restart and check, then a clean stop."""
        result = CycleResult("final", cut="none: a clean stop")
        try:
            daemon = self._daemon()
            try:
                after_crash = self.report.cycles > 0
                problems, result.lost = check_served(self.root, self.model, after_crash=after_crash)
                self.report.problems += [f"final, served: {p}" for p in problems]
                status = daemon.terminate(timeout_s=DAEMON_STOP_TIMEOUT_S)
                if status != 0:
                    self.report.problems.append(f"the daemon's clean stop exited {status}")
                result.ok = not problems and status == 0
            finally:
                daemon.kill()
        finally:
            self.report.record(result, self.model.acked_ops)


class CampaignInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM stopped the campaign; its processes and mount are gone.

    A ``KeyboardInterrupt``, so callers that do not look for it stop as they
    would on Ctrl-C; :func:`main` writes ``report`` first.
    """

    def __init__(self, report: PowerLossReport) -> None:
        super().__init__("the power-loss campaign was interrupted")
        self.report = report


def run_campaign(
    out_dir: str | os.PathLike[str],
    *,
    cycles: int = DEFAULT_CYCLES,
    seed: int = DEFAULT_SEED,
    max_run_s: float = DEFAULT_MAX_RUN_S,
    inject_probability: float = DEFAULT_INJECT_PROBABILITY,
    lazyfs: bool = True,
    lazyfs_bin: str | None = None,
    cache_size_bytes: int = DEFAULT_CACHE_SIZE_BYTES,
    after_cut: Callable[[Path], None] | None = None,
    log: Callable[[str], None] = lambda line: None,
    verify_cuts: bool | None = None,
) -> PowerLossReport:
    """Run ``cycles`` power-loss cycles; the daemon's and LazyFS's logs go to ``out_dir``.

    ``lazyfs=False`` runs the same cycles on a plain directory with SIGKILL only
    (no power loss): a check of the campaign itself where LazyFS is missing.
    ``after_cut`` is called with the state directory after each remount and
    before the check; tests use it to plant a loss. ``verify_cuts`` (default:
    on LazyFS) writes unsynced bytes to the mount before each cut and fails the
    campaign if a cut kept them. Raises ``faultfs.lazyfs.LazyFSUnavailable``
    when LazyFS is wanted but missing or does not mount, and
    :class:`CampaignInterrupted` on a KeyboardInterrupt, after cleaning up.
    """
    if cycles < 1 or max_run_s < MIN_RUN_S or not 0 <= inject_probability <= 1:
        raise ValueError("need cycles >= 1, max_run_s >= 0.05 s and 0 <= inject_probability <= 1")
    out = Path(out_dir).absolute()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="substrat-powerloss-"))
    report = PowerLossReport(seed, "lazyfs" if lazyfs else "plain", cycles)
    report.cuts_checked = lazyfs if verify_cuts is None else verify_cuts
    report.notes += [
        f"another campaign's mount (running, or left by a killed run): {x}"
        for x in leftover_campaigns()
    ]
    for note in report.notes:
        log(f"powerloss: note: {note}")
    began = time.monotonic()
    disk: Any
    if lazyfs:
        from faultfs.lazyfs import LazyFS

        for name in ("mnt", "backing"):
            (work / name).mkdir()
        disk = LazyFS(
            work / "mnt",
            work / "backing",
            binary=lazyfs_bin,
            cache_size_bytes=cache_size_bytes,
            fifo_dir=out / "lazyfs",
        )
        report.lazyfs_binary = disk.binary
    else:
        (work / "state").mkdir()
        disk = PlainDisk(work / "state")
        inject_probability = 0.0
    keep = False
    campaign: Campaign | None = None
    interrupted = False
    try:
        if lazyfs:
            mount_first(disk)
        keep = True
        root = work / "root"
        root.mkdir(mode=0o700)
        for name in STATE_DIRS:
            (Path(disk.mount_dir) / name).mkdir()
            (root / name).symlink_to(Path(disk.mount_dir) / name, target_is_directory=True)
        campaign = Campaign(
            disk,
            root,
            out,
            report,
            max_run_s=max_run_s,
            inject_probability=inject_probability,
            cache_size_bytes=cache_size_bytes if lazyfs else None,
            after_cut=after_cut,
            log=log,
            verify_cuts=report.cuts_checked,
        )
        try:
            for index in range(cycles):
                _raise_if_signalled()
                if not campaign.cycle(index):
                    break
            else:
                campaign.finish()
        except (DaemonError, FaultFSError, RuntimeError) as exc:
            # A daemon that will not start or a mount that will not come back ends the
            # campaign; the report says so instead of a bare traceback.
            report.problems.append(f"campaign stopped: {type(exc).__name__}: {exc}")
        except KeyboardInterrupt:
            interrupted = True
            at = report.cycle_results[-1].label if report.cycle_results else "1"
            report.problems.append(
                f"campaign interrupted (SIGINT or SIGTERM) in cycle {at}; "
                "the daemon was killed and the mount taken down"
            )
        state = campaign.model.state
        report.agents_at_end = len(state.agents)
        report.turns_at_end = sum(len(a.turns) for a in state.agents.values())
        keep = not report.ok
    finally:
        report.seconds = round(time.monotonic() - began, 1)
        if campaign is not None:
            campaign.stop_processes()
        try:
            if lazyfs:
                disk.unmount(LAZYFS_TIMEOUT_S)
        except FaultFSError as exc:
            report.problems.append(f"taking the mount down failed: {type(exc).__name__}: {exc}")
        finally:
            backing = work / ("backing" if lazyfs else "state")
            if keep and backing.exists():
                # What the disk held at the failure, for reproducing it offline.
                shutil.copytree(
                    backing, out / "state-at-failure", dirs_exist_ok=True, symlinks=True
                )
            shutil.rmtree(work, ignore_errors=True)
    if interrupted:
        raise CampaignInterrupted(report)
    return report


def _not_run(out: Path, reason: str) -> None:
    """A report for the job summary when the campaign could not start."""
    out.mkdir(parents=True, exist_ok=True)
    text = f"# Power-loss campaign: NOT RUN\n\n{reason}\n"
    (out / "report.md").write_text(text)
    (out / "report.json").write_text(json.dumps({"ok": False, "not_run": reason}, indent=2) + "\n")


_SIGNALLED: list[int] = []
"""The SIGINT or SIGTERM that :func:`_raise_on_sigterm`'s handler took, if any."""


def _raise_if_signalled() -> None:
    """Raise the KeyboardInterrupt of a signal taken before, which may not have reached us.

    A signal handler's exception is raised wherever the main thread is: inside a
    ``weakref.finalize`` callback or a ``__del__`` run by the garbage collector, Python
    prints "Exception ignored in" and goes on. The campaign then ran all its cycles with
    both signals ignored, and a cancelled job waited for it to end (seen once in the
    main job: 60 s, then a SIGKILL that left its daemon and directory behind). Checked
    before each cycle and in its waits, so such a signal costs at most one cycle's step.
    """
    if _SIGNALLED:
        raise KeyboardInterrupt


def _raise_on_sigterm() -> None:
    """SIGTERM (a CI job cancelled or timed out) stops the campaign like Ctrl-C does.

    After the first signal both are ignored, so the cleanup (bounded by its own
    timeouts) is not cut short and leaves no daemon, LazyFS or mount behind; the
    signal is remembered for :func:`_raise_if_signalled`.
    """

    def handler(signum: int, frame: object) -> None:
        _SIGNALLED.append(signum)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, handler)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m oracle.powerloss", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--cycles", type=int, default=DEFAULT_CYCLES, help=f"power cuts (default {DEFAULT_CYCLES})"
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=DEFAULT_SEED,
        help=f"seed of the workload and the cut points (default {DEFAULT_SEED})",
    )
    parser.add_argument(
        "--max-run-s",
        type=float,
        default=DEFAULT_MAX_RUN_S,
        help=f"longest load before a cut (default {DEFAULT_MAX_RUN_S})",
    )
    parser.add_argument(
        "--inject-probability",
        type=float,
        default=DEFAULT_INJECT_PROBABILITY,
        help="share of cycles cut by a LazyFS crash fault instead of a clear-cache "
        f"(default {DEFAULT_INJECT_PROBABILITY})",
    )
    parser.add_argument(
        "--cache-mib",
        type=int,
        default=DEFAULT_CACHE_SIZE_BYTES >> 20,
        help=f"LazyFS's cache, which the whole state must fit in twice "
        f"(default {DEFAULT_CACHE_SIZE_BYTES >> 20})",
    )
    parser.add_argument("--lazyfs-bin", help="the lazyfs binary (default: $LAZYFS_BIN, PATH)")
    parser.add_argument("--out", default="powerloss-out", help="report and logs go here")
    parser.add_argument(
        "--skip-without-lazyfs",
        action="store_true",
        help="exit 0 with a notice instead of failing when LazyFS is missing",
    )
    parser.add_argument(
        "--plain-dir",
        action="store_true",
        help="no LazyFS: the same cycles on a plain directory, SIGKILL only (no power loss), "
        "to check the campaign itself",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    out = Path(args.out)
    reason = None if args.plain_dir else lazyfs_unavailable_reason(args.lazyfs_bin)
    _raise_on_sigterm()
    try:
        if reason is None:
            report = run_campaign(
                args.out,
                cycles=args.cycles,
                seed=args.seed,
                max_run_s=args.max_run_s,
                inject_probability=args.inject_probability,
                lazyfs=not args.plain_dir,
                lazyfs_bin=args.lazyfs_bin,
                cache_size_bytes=args.cache_mib << 20,
                log=lambda line: print(line, file=sys.stderr, flush=True),
            )
    except ValueError as exc:
        parser.error(str(exc))
    except FaultFSError as exc:  # LazyFSUnavailable: found, but it does not mount here
        reason = str(exc)
    except CampaignInterrupted as exc:
        report = exc.report
        print("powerloss: interrupted; the report so far follows.", file=sys.stderr)
        status = 128 + (_SIGNALLED[0] if _SIGNALLED else signal.SIGINT)
    else:
        status = 0 if reason is None and report.ok else 1
    if reason is not None:
        if args.skip_without_lazyfs:
            print(f"powerloss: SKIPPED. {reason}")
            _not_run(out, f"Skipped: {reason}")
            return 0
        print(f"powerloss: cannot run. {reason}", file=sys.stderr)
        _not_run(out, reason)
        return 2
    (out / "report.json").write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    (out / "report.md").write_text(report.render())
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.render())
    return status


if __name__ == "__main__":
    sys.exit(main())
