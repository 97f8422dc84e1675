"""``substrat daemon start|stop|status|restart|logs``."""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, NoReturn

import click

from substrat import client as client_mod
from substrat.cli.common import (
    EXIT_UNAVAILABLE,
    Opts,
    emit_json,
    esc,
    for_terminal,
    group_options,
    lazy_module,
    offline_command,
)
from substrat.errors import DaemonNotRunningError, DaemonStoppedUncleanlyError, RootLockedError
from substrat.rpc import lock
from substrat.rpc.transport import socket_path
from substrat.shellword import shell_word, shown
from substrat.words import plural, when

if TYPE_CHECKING:
    from substrat.cli import lines
else:
    lines = lazy_module("substrat.cli.lines")  # loaded when a line says something


_SERVING_POLL_S = 0.05
"""How often a foreground start looks whether its daemon serves, to let go of the start
lock (a ping: tens of microseconds)."""


@click.group("daemon")
@group_options
def daemon_group(group_root: Path | None, group_json: bool) -> None:
    """Start, stop and inspect the daemon of a root."""


def _daemon_args(
    heartbeat_s: float | None,
    grace_s: float | None,
    max_turns: int | None = None,
    slots: int | None = None,
) -> list[str]:
    args: list[str] = []
    for flag, value in (
        ("--heartbeat-s", heartbeat_s),
        ("--grace-s", grace_s),
        ("--max-turns", max_turns),
        ("--slots", slots),
    ):
        if value is not None:
            args += [flag, str(value)]
    return args


_heartbeat = click.option(
    "--heartbeat-s",
    type=click.FloatRange(min=0.05),
    default=None,
    help="Seconds between heartbeat notifications (default 5).",
)
_grace = click.option(
    "--grace-s",
    type=click.FloatRange(min=0),
    default=None,
    help="On stop, seconds running turns get to finish (default 10).",
)
# the daemon's own defaults and ranges (substrat.rpc.server.Limits, substrat.daemon and
# substrat.multiplexer; a unit test keeps them equal), not imported: a CLI start loads neither
DEFAULT_MAX_TURNS = 8
MAX_TURNS_LIMIT = 4096
DEFAULT_SLOTS = 8
MAX_SLOTS = 4096
_max_turns = click.option(
    "--max-turns",
    type=click.IntRange(1, MAX_TURNS_LIMIT),
    default=None,
    help=f"Turns the daemon runs at once, 1-{MAX_TURNS_LIMIT} (default "
    f"{DEFAULT_MAX_TURNS}); `agent send` beyond it fails, or waits with --wait.",
)
_slots = click.option(
    "--slots",
    type=click.IntRange(1, MAX_SLOTS),
    default=None,
    help=f"Live provider sessions per provider, 1-{MAX_SLOTS} (default {DEFAULT_SLOTS}); the "
    "least recently used idle one is saved and evicted to make room.",
)


def _daemon_settings(func: Callable[..., None]) -> Callable[..., None]:
    """The options of the daemon a command starts (start, restart), passed on to it as its
    command line (``extra``)."""

    @functools.wraps(func)
    def with_settings(
        *args: Any,
        heartbeat_s: float | None,
        grace_s: float | None,
        max_turns: int | None,
        slots: int | None,
        **kwargs: Any,
    ) -> None:
        func(*args, extra=_daemon_args(heartbeat_s, grace_s, max_turns, slots), **kwargs)

    for option in (_slots, _max_turns, _grace, _heartbeat):
        with_settings = option(with_settings)
    return with_settings


_start_timeout = click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0.1),
    default=client_mod.START_TIMEOUT_S,
    show_default=True,
    help="Seconds to wait for the daemon to answer.",
)


@daemon_group.command("start")
@offline_command(creates_root=True)
@click.option("--foreground", is_flag=True, help="Run in this terminal (logs to stderr).")
@_start_timeout
@_daemon_settings
def start(opts: Opts, foreground: bool, timeout_s: float, extra: list[str]) -> None:
    """Start the daemon (in the background unless --foreground).

    On a path that holds no root (a new or empty directory) it makes one, and says so.
    """
    if foreground:
        _run_here(opts, timeout_s, extra)
    pid, started = client_mod.start_daemon(opts.root, timeout_s=timeout_s, daemon_args=extra)
    _created(opts)
    status = _status(opts)
    other = None if started else _other_code(status)
    if opts.json:
        emit_json(
            {
                "pid": pid,
                "started": started,
                "created": opts.new_root,
                "root": str(opts.root),
                "other_code": other,
                "status": status,
            }
        )
        return
    verb = "started" if started else "already running"
    opts.out.print(f"daemon {verb} [bold](pid {pid})[/] on {esc(opts.root)}")
    _say_other_code(opts, other)
    notice = (status or {}).get("last_recovery")
    if started and notice:
        with client_mod.Client(opts.root, timeout_s=opts.timeout_s).connect() as conn:
            names = lines.names_of(conn.call("agent.list"))
        for line in lines.recovery_lines(notice, names):
            opts.out.print(f"  {line}")


def _other_code(status: dict[str, Any] | None) -> str | None:
    """What other substrat the daemon runs, if not this command's (see substrat.codeid)."""
    from substrat import codeid

    return codeid.other_code(status.get("code")) if status is not None else None


def _say_other_code(opts: Opts, other: str | None) -> None:
    if other is not None:  # mid-upgrade: the old code serves until restarted
        opts.out.print(
            f"  [yellow]it runs {esc(other)}, not this command's[/]; "
            f"`substrat daemon restart --root {esc(shell_word(opts.root))}` runs this one "
            "(running turns finish first)"
        )


def _run_here(opts: Opts, timeout_s: float, extra: list[str]) -> NoReturn:
    """``daemon start --foreground``: the daemon in this process, started under the root's
    start lock as a background start is (substrat.rpc.starting), so that it and another
    start (a command's, a restart's, another --foreground) converge on one daemon: it
    waits for a start in progress, and names the daemon that serves instead of racing it."""
    from substrat import daemon, rootdir
    from substrat.rpc.starting import take_start_lock

    if opts.new_root:  # made here, not in the daemon's log: a mistyped path shows
        rootdir.prepare_root(opts.root)
        _created(opts)

    def waiting(pid: int | None) -> None:
        if not opts.json:
            who = f" (pid {pid})" if pid is not None else ""
            opts.err.print(
                f"substrat: another start of the daemon for {esc(opts.root)}{who} is under "
                f"way; waiting for it (up to {timeout_s:g}s)"
            )

    held = take_start_lock(opts.root, timeout_s, waiting)
    answer = client_mod.ping(opts.root)
    if answer is not None and not answer.get("stopping"):
        if held is not None:
            os.close(held)
        raise RootLockedError(
            f"a daemon already serves {opts.root} (pid {answer['pid']}); this terminal runs "
            f"none: `substrat daemon stop --root {shell_word(opts.root)}` first to run it here"
        )
    if held is not None:  # until this process's daemon answers (its recovery included)
        threading.Thread(target=_let_go_once_serving, args=(opts.root, held), daemon=True).start()
    sys.exit(daemon.main(["--root", str(opts.root), *extra]))


def _let_go_once_serving(root: Path, held: int) -> None:
    me = os.getpid()
    while True:
        answer = client_mod.ping(root)
        if answer is not None and answer.get("pid") == me:
            break
        time.sleep(_SERVING_POLL_S)
    os.close(held)


def _say_unreachable(opts: Opts, only_pid: bool) -> None:
    """A daemon that holds the root but does not answer: still starting (it binds its socket
    after recovery), or its socket or lock file was removed by hand. Named, exit 3."""
    info = lock.read_info(opts.root)
    held = lock.is_held(opts.root)
    pid = info.pid if held and info is not None else client_mod.unreachable_daemon(opts.root)
    if pid is None:
        return
    sock = socket_path(opts.root)
    if opts.json:
        emit_json({"running": True, "answering": False, "pid": pid, "root": str(opts.root)})
    elif only_pid:
        click.echo(str(pid))
    else:
        gone = [f"{p.name}" for p in (sock, lock.lock_path(opts.root)) if not p.exists()]
        why = f"its {' and '.join(gone)} {'is' if len(gone) == 1 else 'are'} gone" if gone else ""
        opts.out.print(
            f"[yellow]daemon pid {pid} holds the root but does not answer[/] on "
            f"{esc(opts.root)}" + (f": {esc(why)}" if why else "")
        )
        if lock.socket_gone(opts.root) is not None:
            why = "  it serves, but will never answer there; "
        else:
            why = "  it may still be starting (recovery runs before it answers); if its files "
            why += "were removed, "
        opts.out.print(
            f"{why}`substrat daemon restart --root {esc(shell_word(opts.root))}` stops it "
            "(SIGTERM) and starts one that makes them again"
        )
    sys.exit(EXIT_UNAVAILABLE)


def _created(opts: Opts) -> None:
    """Say on stderr that this command made a new root (as ``agent create`` says it): a
    mistyped path would otherwise become an empty root without a word."""
    if opts.new_root and not opts.json:
        opts.err.print(f"substrat: created a new root at {esc(opts.root)}")


def _status(opts: Opts) -> dict[str, Any] | None:
    try:
        with client_mod.Client(opts.root, timeout_s=opts.timeout_s).connect() as conn:
            result = conn.call("daemon.status")
    except DaemonNotRunningError:
        return None
    return result if isinstance(result, dict) else None


@daemon_group.command("stop")
@offline_command()
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0.1),
    default=client_mod.STOP_TIMEOUT_S,
    show_default=True,
    help="Seconds to wait for the daemon to exit.",
)
def stop(opts: Opts, timeout_s: float) -> None:
    """Stop the daemon cleanly: running turns finish, sessions are suspended."""
    pid = client_mod.stop_daemon(opts.root, timeout_s=timeout_s)
    after = lock.read_info(opts.root) if pid is not None else None
    unsaved = after.summary_unsaved if after is not None and after.pid == pid else None
    if opts.json:
        stopped = {"stopped": pid is not None, "pid": pid, "root": str(opts.root)}
        emit_json(stopped | ({"summary_unsaved": unsaved} if unsaved else {}))
    elif pid is None:
        opts.out.print(f"no daemon running on {esc(opts.root)}")
    else:
        opts.out.print(f"daemon stopped [bold](pid {pid})[/]")
    if unsaved and not opts.json:
        opts.err.print(
            f"the start summary was not saved ({esc(unsaved)}): nothing is lost, the next "
            "start reads the logs instead (slower for a large root)"
        )


@daemon_group.command("restart")
@offline_command(creates_root=True)
@_start_timeout
@_daemon_settings
def restart(opts: Opts, timeout_s: float, extra: list[str]) -> None:
    """Stop the daemon (if it runs) and start it again (on a path that holds no root, it
    makes one, and says so)."""
    from substrat import rootdir
    from substrat.rpc.starting import refuse_held_root, start_lock

    # The start lock across the stop and the start: a command that finds no daemon in
    # between waits for this start and uses its daemon (this shell's environment). A root
    # an application holds is refused before prepare_root writes anything into it.
    with start_lock(rootdir.prepare_root(refuse_held_root(opts.root)), timeout_s):
        try:
            old = client_mod.stop_daemon(opts.root, timeout_s=client_mod.STOP_TIMEOUT_S)
        except DaemonStoppedUncleanlyError as died:
            old = None
            opts.err.print(f"warning: {esc(str(died))}")  # the start below recovers it
        pid, started = client_mod.start_daemon(
            opts.root, timeout_s=timeout_s, daemon_args=extra, locked=True
        )
    _created(opts)
    if opts.json:
        emit_json(
            {
                "stopped": old,
                "pid": pid,
                "started": started,
                "created": opts.new_root,
                "root": str(opts.root),
            }
        )
    elif not started:
        # a daemon started without the start lock (`python -m substrat.daemon`) won
        opts.err.print(
            f"warning: another process started daemon pid {pid} on {esc(opts.root)} first; it "
            f"runs with that process's environment and options, not this shell's (run "
            f"`substrat daemon restart` again to replace it)"
        )
    elif opts.new_root:
        opts.out.print(f"daemon started [bold](pid {pid})[/] on {esc(opts.root)}: a new root")
    else:
        before = f"stopped pid {old}, " if old is not None else ""
        opts.out.print(f"daemon restarted: {before}running as [bold]pid {pid}[/]")


@daemon_group.command("status")
@offline_command()
@click.option("--pid", "only_pid", is_flag=True, help="Print only the pid (for kill, scripts).")
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0.1),
    default=10.0,
    show_default=True,
    help="Seconds to wait for a running daemon to answer.",
)
def status(opts: Opts, only_pid: bool, timeout_s: float) -> None:
    """Is the daemon running? Uptime, load, and what its last recovery found.

    Exits 3 when no daemon runs (it never starts one).
    """
    opts.timeout_s = timeout_s
    answer = _status(opts)
    if answer is None:
        _say_unreachable(opts, only_pid)
        info = lock.read_info(opts.root)
        last = (
            None
            if info is None
            else {
                "pid": info.pid,
                "state": info.state,
                "started_at": info.started_at,
                "stopped_at": info.stopped_at,
                "recovered_by": info.recovered_by,
            }
        )
        if opts.json:
            emit_json({"running": False, "root": str(opts.root), "last_daemon": last})
        elif not only_pid:
            opts.out.print(f"[red]no daemon running[/] on {esc(opts.root)}")
            if info is not None and info.state == "stopped" and info.recovered_by:
                opts.out.print(
                    f"  last daemon (pid {info.pid}) died; `{esc(info.recovered_by)}` recovered "
                    f"the root at {esc(when(info.stopped_at))}: nothing is left to recover"
                )
            elif info is not None and info.state == "stopped":
                stopped = esc(when(info.stopped_at))
                opts.out.print(f"  last daemon (pid {info.pid}) stopped cleanly at {stopped}")
            elif info is not None:
                opts.out.print(
                    f"  [yellow]last daemon (pid {info.pid}) did not shut down cleanly[/]; "
                    "the next start recovers the root"
                )
        sys.exit(EXIT_UNAVAILABLE)
    if only_pid:
        click.echo(str(answer["pid"]))
        return
    if opts.json:
        emit_json({"running": True, **answer})
        return
    out = opts.out
    out.print(f"[green]running[/] [bold]pid {answer['pid']}[/] on {esc(shown(answer['root']))}")
    out.print(f"  up {answer['uptime_s']:.1f}s since {answer['started_at']} (v{answer['version']})")
    _say_other_code(opts, _other_code(answer))
    out.print(
        f"  agents {answer['agents']} ({answer['roots']} roots), turns running "
        f"{answer['busy_turns']}, connections {answer['connections']}, "
        f"subscribers {answer['subscribers']}"
    )
    out.print(f"  previous shutdown: {answer['previous_shutdown']}")
    unused = answer.get("start_summary_unused")
    if unused:  # as daemon.log says it: what the start read without its summary, and why
        out.print(f"  [{'yellow' if unused['damaged'] else 'dim'}]{esc(unused['message'])}[/]")
    for line in answer.get("logs_behind_checkpoint") or []:  # entries gone: until a restart
        out.print(f"  [bold red]{esc(line)}[/]")
    failing = answer.get("checkpoints")
    if failing:  # nothing is lost by it, but starts read more of the logs until it is fixed
        out.print(f"  [yellow]{esc(checkpoint_trouble(failing))}[/]")
    for item in answer.get("unapplied") or []:  # memory behind the log: retried, and said
        out.print(
            f"  [yellow]{esc(item['agent'])}: turn {esc(item['turn_id'])} committed but not "
            f"applied yet ({esc(item['error'])}); the daemon retries it, a restart applies it[/]"
        )
    for item in answer.get("unfinished") or []:
        out.print(
            f"  [yellow]{esc(item['what'])}, but a later step failed ({esc(item['error'])}); "
            "the daemon retries it, a restart finishes it[/]"
        )
    io_error = answer.get("last_io_error")
    if io_error:
        out.print(
            f"  last I/O failure: {esc(io_error['method'])} at {esc(io_error['time'])}: "
            f"{esc(io_error['message'])}"
        )
    notice = answer.get("last_recovery")
    if notice:
        with client_mod.Client(opts.root, timeout_s=opts.timeout_s).connect() as conn:
            names = lines.names_of(conn.call("agent.list"))
        out.print("  [bold]last recovery:[/]")
        for line in lines.recovery_lines(notice, names):
            out.print(f"    {line}")


LOG_POLL_S = 0.2


@daemon_group.command("logs")
@offline_command()
@click.option(
    "-n",
    "--lines",
    type=click.IntRange(min=0),
    default=50,
    show_default=True,
    help="How many of the last lines to print first.",
)
@click.option("-f", "--follow", is_flag=True, help="Keep printing lines as the daemon adds them.")
def logs(opts: Opts, lines: int, follow: bool) -> None:
    """Print the daemon's log (<root>/daemon.log), like tail; -f follows it.

    The log is for people: startups, what recovery found, refused
    connections, shutdowns. With --json each line is {"line": ...}.
    """
    path = opts.root / client_mod.LOG_NAME

    def show(line: str) -> None:
        if opts.json:
            emit_json({"line": line})
        else:
            click.echo(for_terminal(line))

    try:
        handle: BinaryIO = open(path, "rb")
    except FileNotFoundError:
        if not follow:
            opts.err.print(f"no daemon log yet at {esc(path)}")
            return
        handle = _wait_for(path)
    with handle:
        if lines:
            # Reading the tail leaves the file at the end of what it read: a line the daemon
            # adds meanwhile is followed, not skipped (as a seek to the end would).
            for line in deque(handle, maxlen=lines):
                show(line.decode("utf-8", "replace").rstrip("\n"))
        else:
            handle.seek(0, os.SEEK_END)
        while follow:
            chunk = handle.readline()
            if not chunk:
                if os.path.getsize(path) < handle.tell():  # truncated: start over
                    handle.seek(0)
                time.sleep(LOG_POLL_S)
                continue
            while not chunk.endswith(b"\n"):  # a line still being written
                time.sleep(LOG_POLL_S / 4)
                chunk += handle.readline()
            show(chunk.decode("utf-8", "replace").rstrip("\n"))


def _wait_for(path: Path) -> BinaryIO:
    while True:
        try:
            return open(path, "rb")
        except FileNotFoundError:
            time.sleep(LOG_POLL_S)


def checkpoint_trouble(failing: dict[str, Any]) -> str:
    """One line on the checkpointer's failures (see substrat.daemon's status)."""
    broken = failing.get("store_out_of_use")
    if broken:
        what = f"checkpoints stopped: the checkpoint store is out of use ({broken})"
    else:
        failures = int(failing.get("failures") or 0)
        what = f"{plural(failures, 'checkpoint')} failed, the last: {failing.get('last_error')}"
    return (
        f"{what}; no turn is lost by it (the logs are the record), but the next start "
        "reads more of them; stop the daemon and run `substrat fsck` for the fix"
    )
