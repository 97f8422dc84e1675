"""The substrat daemon: one process per root, serving JSON-RPC on a Unix socket.

Run it with ``python -m substrat.daemon --root R`` (foreground) or
``substrat daemon start`` (background, output in ``R/daemon.log``).

Life of a daemon:

1. prepare the root (:func:`substrat.rootdir.prepare_root`: create, adopt or
   upgrade it; a directory that is not a root or cannot be written is refused,
   untouched) and take its lock (a second daemon is refused with a message
   naming the first);
2. read the lock file's clean-shutdown marker: ``running`` means the previous
   daemon died without shutting down;
3. open the orchestrator, which recovers the root from its logs, and log a
   summary; the report is kept for ``daemon.status`` and sent as a
   ``daemon.recovered`` notification to every subscriber that connects;
4. bind ``R/daemon.sock`` (0600; peers of another uid are refused) and serve;
5. on SIGTERM/SIGINT (or ``daemon.shutdown``): stop taking work, let running
   turns finish (up to ``grace_s``), suspend every session (blobs saved), mark
   the lock file ``stopped`` and exit 0.

SIGKILL at any moment loses nothing that was acknowledged: an answer is sent
only after the orchestrator made the operation durable.

Exit codes: 0 clean stop, 1 failed to start (see the log), 2 bad arguments or
a root it cannot use (not a root, not writable, another user's), 3 the root is
locked by another daemon.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from substrat import __version__, codeid, daemon_logging
from substrat.checkpointer import CheckpointPolicy
from substrat.daemon_providers import build_registry
from substrat.errors import RootError, RootLockedError, SubstratError
from substrat.eventlog import utc_now_iso
from substrat.oserrors import advice, is_host_limit
from substrat.provider_env import kept as kept_provider_env
from substrat.recovery_words import logs_behind, summarize_recovery, summary_unused
from substrat.root_hold import RootHold
from substrat.rootdir import check_serving, prepare_root, user_log_failure
from substrat.rootguard import CHECK_EVERY_S, RootGuard, check_every_s
from substrat.rootlinks import refuse_linked
from substrat.rpc.lock import RootLock
from substrat.rpc.methods import build_methods
from substrat.rpc.server import Limits, RpcServer
from substrat.rpc.transport import bind_private, socket_path
from substrat.wakeloop import WakePacer, wake_loop
from substrat.words import plural

if TYPE_CHECKING:
    from substrat.orchestrator import Orchestrator

log = logging.getLogger("substrat.daemon")

HEARTBEAT_S = 5.0
GRACE_S = 10.0
DEFAULT_SLOTS = 8
NOTABLE_RECOVERY_KEYS = (
    "lost_turns",
    "redelivered",
    "reconciled",
    "quarantined",
    "orphans_terminated",
    "cascaded",
    "unrecoverable",
    "detached",
    "records_rebuilt",
    "log_repairs",
    "log_damage",
    "lost_roots",
    "unreadable",
    "registry_problem",
    "roots_registered",
    "creations_rebuilt",
    "incidents",
)
"""A report with any of these is published even after a clean shutdown."""


def as_reported(data: dict[str, Any], previous_shutdown: str) -> dict[str, Any]:
    """A recovery report as a start tells it: only a crash redelivers. After a clean stop
    (or a crash an offline recovery has reported already), a message still pending was
    simply waiting: it is listed under ``waiting``, not ``redelivered``, which would
    read as a crash's."""
    if previous_shutdown == "unclean" or not data.get("redelivered"):
        return data
    return {**data, "redelivered": [], "waiting": data["redelivered"]}


EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_LOCKED = 3


@dataclass
class DaemonConfig:
    root: Path
    heartbeat_s: float = HEARTBEAT_S
    grace_s: float = GRACE_S
    slots: int = DEFAULT_SLOTS
    limits: Limits = field(default_factory=Limits)
    wake: bool = True
    """Run agents that have pending messages (the wake loop) in the background."""
    root_check_s: float = CHECK_EVERY_S
    """How often the root guard checks the root's path between answers (substrat.rootguard)."""


class Daemon:
    """One running daemon. ``await Daemon(config).run()`` returns the exit code."""

    def __init__(self, config: DaemonConfig) -> None:
        self.config = config
        # the directory the path names now: a symlink repointed later must not move the
        # daemon's by-path writes into another root (substrat.rootguard)
        self.root = Path(os.path.realpath(config.root))
        self.heartbeat_s = config.heartbeat_s
        self.pid = os.getpid()
        self.started_at = utc_now_iso()
        self._started_mono = time.monotonic()
        self.orch: Orchestrator
        self.guard: RootGuard
        self.server = RpcServer(build_methods(self), limits=config.limits, grace_s=config.grace_s)
        self.previous_shutdown = "none"
        self._notice: dict[str, Any] | None = None
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()
        self._stop_reason = ""
        self.served = False
        """Whether it got as far as serving (a failure after that is not a start's)."""

    # -- what the RPC methods see ----------------------------------------------

    def status(self) -> dict[str, Any]:
        orch = getattr(self, "orch", None)
        # counted, not listed: a listing builds every agent's view (and after a start
        # from the summary every agent's node, see substrat.lazy); the heartbeat asks too
        agents = len(orch.tree) if orch is not None else 0
        roots = orch.tree.root_count() if orch is not None else 0
        # what the start found and still stands until a restart: each entry says what to do
        report = orch.recovery_report if orch is not None else None
        held = report.to_dict() if report is not None else {}
        return {
            "pid": self.pid,
            "version": __version__,
            "code": codeid.CODE,
            "root": str(self.root),
            "socket": str(socket_path(self.root)),
            "started_at": self.started_at,
            "uptime_s": self.uptime_s(),
            "agents": agents,
            "roots": roots,
            "busy_turns": orch.busy_turns if orch is not None else 0,
            "rpc_turns": self.server.active_turns,
            "connections": len(self.server.connections),
            "subscribers": self.server.subscribers,
            "refused_connections": self.server.refused_connections,
            "heartbeat_s": self.heartbeat_s,
            "limits": self.server.limits.to_dict(),
            "previous_shutdown": self.previous_shutdown,
            "last_recovery": self._notice,
            "unreadable": list(held.get("unreadable") or []),
            "lost_roots": list(held.get("lost_roots") or []),
            "registry_problem": held.get("registry_problem"),
            "logs_behind_checkpoint": logs_behind(held),
            # open until `substrat fsck --acknowledge ID`, which needs the daemon stopped
            "incidents": list(held.get("incidents") or []),
            "start_summary_unused": summary_unused(held),
            "checkpoints": _checkpoint_health(orch),
            # the running daemon's memory is behind its log here (docs/daemon.md)
            "unapplied": _unapplied(orch),
            "unfinished": [u.to_dict() for u in orch.unfinished] if orch is not None else [],
            "last_io_error": self.server.last_io_error,
            "stopping": self._stop.is_set(),
        }

    def uptime_s(self) -> float:
        return round(time.monotonic() - self._started_mono, 3)

    def recovery_notice(self) -> dict[str, Any] | None:
        return self._notice

    def request_stop(self, reason: str) -> None:
        if not self._stop.is_set():
            self._stop_reason = reason
            self._stop.set()

    # -- life cycle ---------------------------------------------------------------

    async def run(self, early: RootHold | None = None) -> int:
        """Serve until stopped; ``early``: the root's hold, taken by :func:`main` before
        anything was written (taken here when None). The caller releases it on failure."""
        from substrat.orchestrator import Orchestrator
        from substrat.recovery import gc_paused

        lock = RootLock.acquire(self.root)  # RootLockedError propagates to main()
        lock.provider_env = kept_provider_env(lock.previous)  # in every record: see provider_env
        try:
            # before the lock says "running": a root an application has open is
            # refused with the previous daemon's shutdown state left as it was
            hold = early or RootHold.take(self.root)
            self.guard = RootGuard(self.root)
        except BaseException:
            lock.release()
            raise
        try:
            self.previous_shutdown = lock.previous_shutdown
            lock.write(
                pid=self.pid,
                started_at=self.started_at,
                state="running",
                socket=str(socket_path(self.root)),
            )
            log.info(
                "substrat %s daemon pid %d on %s (previous shutdown: %s)",
                __version__,
                self.pid,
                self.root,
                self.previous_shutdown,
            )
            with gc_paused():
                self.orch = await Orchestrator.open(
                    self.root,
                    hold=hold,
                    registry=build_registry(),
                    slots=self.config.slots,
                    checkpoints=CheckpointPolicy.from_env(dict(os.environ), background=True),
                )
                # What a start builds (every live agent's node, session and inbox) lives
                # as long as this process: the collector's later passes skip it (a full
                # pass over a 10,000-agent root cost 50 ms, the first one at start).
                gc.freeze()
            self._record_recovery()
            return await self._serve(lock)
        finally:
            hold.release()
            lock.release()

    async def _serve(self, lock: RootLock) -> int:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(_loop_error)
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.request_stop, signal.Signals(signum).name)
        unsubscribe = self.orch.subscribe(self._on_event)
        self.server.agent_count = lambda: len(self.orch.tree)
        self.orch.on_unapplied = self._wake.set  # the wake loop retries it (wakeloop)
        self.guard.note_marker()  # after the open, which may have upgraded it
        self.server.before_answer = self.guard.enforce  # no answer from a moved root
        guard = asyncio.create_task(self.guard.watch(self.config.root_check_s))
        path = socket_path(self.root)
        sock = bind_private(path)
        listener = await asyncio.start_unix_server(self.server.handle, sock=sock)
        # serving now: a client that finds no socket from here on knows it was removed
        lock.write(
            pid=self.pid,
            started_at=self.started_at,
            state="running",
            socket=str(path),
            socket_ino=os.stat(path).st_ino,
        )
        tasks = [asyncio.create_task(self._heartbeat_loop())]
        if self.config.wake:
            tasks.append(
                asyncio.create_task(wake_loop(self.orch, self._wake, self._stop, WakePacer()))
            )
            self._wake.set()  # messages redelivered by recovery may be waiting
        log.info("ready: listening on %s", path)
        self.served = True
        try:
            await self._stop.wait()
        finally:
            log.info("stopping (%s)", self._stop_reason or "shutdown")
            listener.close()
            self.server.stopping = True
            self._wake.set()
            await self._finish_tasks(tasks)
            guard.cancel()
            await asyncio.gather(guard, return_exceptions=True)
            unsubscribe()
            farewell = {"reason": self._stop_reason or "shutdown", "time": utc_now_iso()}
            await self.server.close_connections(farewell)
            with contextlib.suppress(Exception):
                await listener.wait_closed()
            self.guard.enforce()  # the clean stop writes by path: not into a moved root's old one
            await self.orch.close()
        # `daemon stop` says it: the next start reads the logs instead, nothing is lost
        unsaved = self.orch.checkpointer.summary_unsaved
        lock.write(
            pid=self.pid,
            started_at=self.started_at,
            state="stopped",
            stopped_at=utc_now_iso(),
            **({"summary_unsaved": unsaved} if unsaved else {}),
        )
        # after "stopped": until then a missing socket would read as one removed by hand
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        no_summary = f"; the start summary was not saved ({unsaved})" if unsaved else ""
        log.info("stopped cleanly: sessions suspended%s", no_summary)
        return EXIT_OK

    async def _finish_tasks(self, tasks: list[asyncio.Task[None]]) -> None:
        """Give running turns ``grace_s`` to finish; what is left is cancelled (and lost)."""
        wake = tasks[1] if len(tasks) > 1 else None
        tasks[0].cancel()
        waiting: list[asyncio.Task[Any]] = [wake] if wake is not None else []
        deadline = time.monotonic() + self.config.grace_s
        if waiting:
            await asyncio.wait(waiting, timeout=self.config.grace_s)
        left = max(0.0, deadline - time.monotonic())
        cut = await self.server.drain(left)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if cut:
            log.warning(
                "%s still running after %.1fs cancelled",
                plural(cut, "request was", "requests were"),
                self.config.grace_s,
            )

    def _record_recovery(self) -> None:
        report = self.orch.recovery_report
        data = as_reported(report.to_dict() if report is not None else {}, self.previous_shutdown)
        log.info("recovery: %s", summarize_recovery(data))
        for lost in data.get("lost_roots") or []:
            log.error("lost root agent: %s", lost["what_to_do"])
        for item in data.get("unreadable") or []:
            log.warning(
                "agent %s held back (%s on %s): %s",
                item["session_id"],
                item["error"],
                item["path"],
                item["what_to_do"],
            )
        if data.get("registry_problem"):
            log.error("root registry: %s", data["registry_problem"])
        for line in logs_behind(data):  # an older copy restored: nothing else says so
            log.error("%s", line)
        for incident in data.get("incidents") or []:  # at every start until acknowledged
            log.error("%s", incident["message"])
        unused = summary_unused(data)
        if unused is not None and unused["damaged"]:
            log.warning("%s", unused["message"])
        notable = any(data.get(key) for key in NOTABLE_RECOVERY_KEYS)
        if self.previous_shutdown == "unclean" or notable:
            self._notice = {
                "pid": self.pid,
                "at": self.started_at,
                "previous_shutdown": self.previous_shutdown,
                "report": data,
            }

    def _on_event(self, kind: str, payload: dict[str, Any]) -> None:
        self.server.publish(kind, payload)
        if kind in ("turn.completed", "turn.failed", "agent.terminated") or (
            kind == "message.enqueued" and payload.get("recipient") != "user"
        ):
            self._wake.set()

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_s)
            status = self.status()
            self.server.publish(
                "daemon.heartbeat",
                {key: status[key] for key in ("pid", "uptime_s", "agents", "busy_turns")}
                | {"time": utc_now_iso()},
            )


def parse_args(argv: list[str] | None) -> DaemonConfig:
    parser = argparse.ArgumentParser(
        prog="python -m substrat.daemon", description="Run the substrat daemon in the foreground."
    )
    parser.add_argument("--root", default=os.environ.get("SUBSTRAT_HOME") or "~/.substrat")
    parser.add_argument("--heartbeat-s", type=float, default=HEARTBEAT_S)
    parser.add_argument("--grace-s", type=float, default=GRACE_S)
    parser.add_argument(
        "--slots",
        type=int,
        default=DEFAULT_SLOTS,
        help=f"live provider sessions per provider, 1-4096 (default {DEFAULT_SLOTS})",
    )
    parser.add_argument("--max-connections", type=int, default=Limits.max_connections)
    parser.add_argument(
        "--max-turns",
        type=int,
        default=Limits.max_concurrent_turns,
        help=f"turns run at once (default {Limits.max_concurrent_turns})",
    )
    parser.add_argument("--max-request-bytes", type=int, default=Limits.max_request_bytes)
    parser.add_argument("--no-wake", action="store_true", help="do not run the wake loop")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    for name in (
        "heartbeat_s",
        "grace_s",
        "slots",
        "max_connections",
        "max_turns",
        "max_request_bytes",
    ):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    try:
        root_check_s = check_every_s(os.environ)
    except ValueError as exc:
        parser.error(str(exc))
    daemon_logging.configure(args.log_level)
    return DaemonConfig(
        root=Path(args.root).expanduser().absolute(),
        heartbeat_s=args.heartbeat_s,
        grace_s=args.grace_s,
        slots=args.slots,
        limits=Limits(
            max_request_bytes=args.max_request_bytes,
            max_connections=args.max_connections,
            max_concurrent_turns=args.max_turns,
        ),
        wake=not args.no_wake,
        root_check_s=root_check_s,
    )


def main(argv: list[str] | None = None) -> int:
    try:
        config = parse_args(argv)
    except SystemExit as exc:
        return int(exc.code) if isinstance(exc.code, int) else EXIT_USAGE
    daemon: Daemon | None = None
    hold: RootHold | None = None
    try:
        # The root's hold before prepare_root may write its marker (and run its lock file),
        # kept by run: one that an application holds gets nothing of this start, and none
        # can open it meanwhile (outside review s21f, F8). Taking it writes nothing.
        with contextlib.suppress(OSError):  # none there yet, or prepare_root says why
            hold = RootHold.take(config.root)
        config.root = prepare_root(config.root)
        refuse_linked(config.root)
        check_serving(config.root)
        daemon = Daemon(config)
        return asyncio.run(daemon.run(hold))
    except RootLockedError as exc:
        from substrat.rpc.lock import in_use, is_held
        from substrat.rpc.starting import offline_work

        # an offline compact/fsck/recover: when to retry, not "stop it" (no daemon runs); a
        # daemon as its lock file names it (the hold above refused this start first)
        held = in_use(config.root) if is_held(config.root) else None
        log.error("%s", offline_work(config.root) or held or exc)
        return EXIT_LOCKED
    except RootError as exc:
        log.error("cannot start: %s", exc)
        return EXIT_USAGE
    except (SubstratError, OSError) as exc:
        if daemon is not None and daemon.served:
            # it served, then its stop failed (a full disk refusing a session's blob):
            # not a start's failure, and nothing acknowledged is lost
            hint = advice(exc)
            log.error(
                "stopped without a clean shutdown: %s%s; the next start recovers the root, "
                "nothing acknowledged is lost",
                exc,
                f" ({hint})" if hint else "",
            )
            return EXIT_FAILED
        if isinstance(exc, SubstratError):
            log.error("cannot start: %s", exc)
            return EXIT_FAILED
        why = user_log_failure(config.root, exc)  # EIO on the inbox: no check foresees it
        if why is None:
            log.exception("daemon failed")
            return EXIT_FAILED
        log.error("cannot start: %s", why)
        return EXIT_USAGE
    except Exception:
        log.exception("daemon failed")
        return EXIT_FAILED
    finally:
        if hold is not None:
            hold.release()  # (idempotent: run gives it back itself once it served)


def _checkpoint_health(orch: Orchestrator | None) -> dict[str, Any] | None:
    """The checkpointer's failures in this process (None: none, or no orchestrator yet).

    A failed checkpoint loses nothing (the logs stay the record) but the next
    start reads more of them; a store out of use takes no more checkpoints until
    a restart, so ``daemon status`` says so instead of only daemon.log.
    """
    if orch is None:
        return None
    checkpointer = orch.checkpointer
    stats = checkpointer.stats
    broken = checkpointer.store.broken
    if not stats.failures and broken is None:
        return None
    return {
        "failures": stats.failures,
        "last_error": stats.errors[-1] if stats.errors else None,
        "store_out_of_use": broken,
    }


LOOP_ERROR_EVERY_S = 10.0
"""The same host-limit error of the event loop is logged once in this long (asyncio's
accept retries every second, several accepts at a time)."""
_LAST_LOOP_ERROR: dict[str, float] = {}


def _loop_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """asyncio's own failures: a host limit (no descriptor left to accept a connection
    with) is one line saying what fixes it, not a traceback a second."""
    exc = context.get("exception")
    if is_host_limit(exc):
        line = f"{context.get('message', 'event loop')}: {exc} ({advice(exc)})"
        now = time.monotonic()
        if _LAST_LOOP_ERROR.get(line, -LOOP_ERROR_EVERY_S) + LOOP_ERROR_EVERY_S <= now:
            _LAST_LOOP_ERROR.clear()  # one line kept: the errors come from a few places
            _LAST_LOOP_ERROR[line] = now
            log.error("%s", line)
        return
    loop.default_exception_handler(context)


def _unapplied(orch: Orchestrator | None) -> list[dict[str, Any]]:
    """The committed turns whose effects the daemon has not applied yet (see
    ``CommitMixin.apply_committed``): their agents take no turn until they are."""
    if orch is None:
        return []
    return [item.to_dict(orch.tree.path(a)) for a, item in orch.unapplied.items() if a in orch.tree]


if __name__ == "__main__":
    from substrat.process_end import leave

    leave(main())  # after main(): its stop wrote and fsynced all it owes (process_end)
