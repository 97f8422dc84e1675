"""The tests' daemons forked off a warm interpreter: ``DaemonProcess.spawn`` for the tests.

A daemon start (``python -P -m substrat.daemon --root R``) costs about 0.18 CPU s, most of
it the interpreter's start and the imports (docs/benchmarks.md). :func:`install` replaces
:meth:`substrat.client.DaemonProcess.spawn` in the tests' process with :func:`spawn`: the
daemon is then a child forked off a second server of tests/support/warm.py (role
``daemon``: ``python -P -c``, which imported what the daemon imports), asked over its
socket, so that the pytest process never forks itself. The server's child becomes the
daemon as a fresh one starts: a session of its own (setsid), stdin ``/dev/null``, stdout
and stderr the log's descriptor and no other descriptor open, the environment, working
directory and umask of the request, the signal dispositions and mask of a fresh
interpreter (the server changes none), ``sys.argv``/``sys.orig_argv`` and ``sys.path`` as
``-P -m`` gives them, and ``__main__`` made by runpy, which runs the daemon's module once
as in a fresh ``-m`` run (the server imported its imports, not the module itself). It
ends through the interpreter's exit path; the server reaps it and reports its exit
status (negative for a signal, as subprocess does). The returned :class:`WarmDaemon` has
Popen's interface; its signals go through a pidfd of the very process (a real SIGKILL of
a real process, race-free). A client that lets go of it leaves it running, as of a
Popen; the server's end (the tests' end) kills what still runs.

Falls back to a fresh process where warm.py's commands do (another program or
environment read at start, another uid, resource limit or signal disposition,
``SUBSTRAT_TEST_FRESH_PROCESSES=1``, a server that cannot start).

Known differences besides warm.py's: the daemon's parent is the server (it is reaped as
soon as it exits, so no zombie waits for :meth:`WarmDaemon.wait`), and ``sys.flags`` is
the server's (which is ``-P``, as the daemon's).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
from typing import Any

from substrat.client import DaemonProcess
from tests.support import warm
from tests.support.warm_server import identity, start_environment

DAEMON_COMMAND = [sys.executable, "-P", "-m", "substrat.daemon"]
_fresh_spawn = DaemonProcess.spawn


class WarmDaemon:
    """A daemon forked off the warm server: the Popen interface DaemonProcess and the
    tests use (pid, returncode, poll, wait, send_signal, terminate, kill)."""

    def __init__(self, args: list[str], conn: socket.socket, pid: int, pidfd: int) -> None:
        self.args = args
        self.pid = pid
        self.returncode: int | None = None
        self._conn: socket.socket | None = conn
        self._pidfd: int | None = pidfd
        self._killed = False

    def poll(self) -> int | None:
        return self._reap(0)

    def wait(self, timeout: float | None = None) -> int:
        # Without a timeout, only a kill's wait (DaemonProcess.kill) is unlimited in Popen;
        # here it has a limit too: the server reports a SIGKILLed child's exit at once.
        limit = warm.REPLY_LIMIT_S if timeout is None and self._killed else timeout
        code = self._reap(limit)
        if code is None:
            if timeout is None:
                raise RuntimeError(f"the warm server did not report killed daemon {self.pid}")
            raise subprocess.TimeoutExpired(self.args, timeout)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None and self._pidfd is not None:
            try:
                signal.pidfd_send_signal(self._pidfd, sig)
            except ProcessLookupError:  # exited, not yet reported
                pass
            self._killed = self._killed or sig == signal.SIGKILL

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _reap(self, timeout: float | None) -> int | None:
        if self.returncode is not None or self._conn is None:
            return self.returncode
        ready, _, _ = select.select([self._conn], [], [], timeout)
        if not ready:
            return None
        message = self._conn.recv(1 << 16)
        if not message:
            self._close()
            raise RuntimeError(f"the warm server died while its daemon {self.pid} ran")
        self.returncode = int(json.loads(message)["exit"])
        self._close()
        return self.returncode

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def __del__(self) -> None:
        self._close()


def _plan(command: list[str], env: dict[str, str] | None) -> warm.Server | str:
    """The server to fork the daemon off, or why it starts fresh."""
    if os.environ.get(warm.FRESH) == "1":
        return warm.FRESH
    if command[: len(DAEMON_COMMAND)] != DAEMON_COMMAND:
        return "program"
    if not all(isinstance(arg, str) for arg in command):
        return "program"
    start = start_environment(warm.inherited_environment() if env is None else env)
    if start != warm._BASELINE_START:
        return "environment"
    if identity() != warm._BASELINE_IDENTITY:
        return "identity"
    server = warm.get_server("daemon")
    if server is None:
        return "no server"
    # its command line is written over the server's (/proc/PID/cmdline): it must fit
    if _length(command) > _length([os.fsdecode(a) for a in server.process.args]):
        return "command line"
    return server


def _length(argv: list[str]) -> int:
    return sum(len(os.fsencode(arg)) + 1 for arg in argv)


def start(server: warm.Server, command: list[str], log_fd: int, env: Any) -> WarmDaemon:
    """Ask ``server`` to fork ``command`` (warm.Unavailable if it did not)."""
    mask = os.umask(0o022)
    os.umask(mask)
    request = {
        "mode": "m",
        "argv": command,
        "interpreter": None,
        "env": warm.inherited_environment() if env is None else {**env},
        "umask": mask,
    }
    null = os.open(os.devnull, os.O_RDONLY)
    directory = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    fds: list[int] = []
    try:
        conn.settimeout(warm.REPLY_LIMIT_S)
        conn.connect(server.socket_path)
        socket.send_fds(conn, [json.dumps(request).encode()], [null, log_fd, log_fd, directory])
        message, fds, _, _ = socket.recv_fds(conn, 1 << 16, 1)
        pid = json.loads(message)["pid"]
        if len(fds) != 1:
            raise ValueError(f"no pidfd with {message!r}")
    except (OSError, ValueError, KeyError) as exc:
        for fd in fds:
            os.close(fd)
        conn.close()
        raise warm.Unavailable(f"the warm server did not start {command!r}: {exc!r}") from exc
    finally:
        os.close(null)
        os.close(directory)
    conn.settimeout(None)
    return WarmDaemon(command, conn, pid, fds[0])


def spawn(self: DaemonProcess, command: list[str], log_fd: int) -> Any:
    """:meth:`DaemonProcess.spawn`, forked off the warm server where that cannot differ
    from a fresh process."""
    plan = _plan(command, self.env)
    if not isinstance(plan, str):
        try:
            daemon = start(plan, command, log_fd, self.env)
        except warm.Unavailable:  # before the daemon started: restarted next time
            plan.process.kill()
            plan = "server gone"
        else:
            warm.counts["daemon warm"] += 1
            return daemon
    warm.counts[f"daemon {plan}"] += 1
    return _fresh_spawn(self, command, log_fd)


def install() -> None:
    """Start the tests' daemons with :func:`spawn` in this process."""
    DaemonProcess.spawn = spawn  # type: ignore[method-assign]
