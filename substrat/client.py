"""A blocking client for the daemon, and starting/stopping the daemon process.

Every wait has a timeout; nothing here hangs silently:

* no daemon: :class:`DaemonNotRunningError` (or one is started, when asked);
* the daemon dies mid-request: :class:`DaemonDiedError`, saying whether it
  crashed or shut down and that the request may or may not have applied;
* the daemon is silent for ``timeout_s``: :class:`RequestTimeoutError`.
  Streamed chunks and notifications count as signs of life, so a long turn
  that keeps streaming does not time out.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from substrat import provider_env, shellword
from substrat.errors import (
    DaemonDiedError,
    DaemonError,
    DaemonNotRunningError,
    DaemonStartError,
    DaemonStoppedUncleanlyError,
    RequestTimeoutError,
    RootPermissionError,
    RpcError,
)
from substrat.rootdir import DAEMON_LOG_NAME, check_serving, prepare_root
from substrat.rpc import lock, protocol, starting
from substrat.rpc.starting import (
    busy_message,
    check_socket,
    died_error,
    exited,
    log_tail,
    not_stopped,
    refused_while_stopping,
    restart_after_stop,
    root_holder,
    start_lock,
    stopping_refusal,
    terminate,
    unreachable_daemon,
    wait_until,
)
from substrat.rpc.transport import connect, socket_path

if TYPE_CHECKING:
    import subprocess

DEFAULT_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 5.0
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
MAX_MESSAGE_BYTES = 256 << 20
LOG_NAME = DAEMON_LOG_NAME
_POLL_S = 0.01
_RESENDS = 3
"""How often one request goes to a next daemon after a stopping one refused it."""
SILENCE_CHECK_S = 20.0
"""How often a call given ``on_silence`` calls it while the daemon says nothing."""
"""How often a start or stop looks again (a ping or a lock probe: tens of microseconds
each); every start, stop and restart waits half of it on average."""

Notification = tuple[str, dict[str, Any]]
NotificationHandler = Callable[[str, dict[str, Any]], None]


def default_root() -> Path:
    """``$SUBSTRAT_HOME``, else ``~/.substrat``."""
    return Path(os.environ.get("SUBSTRAT_HOME") or "~/.substrat").expanduser()


STREAM = "events"
"""What a client reads between requests (notifications), as its errors name it."""


class Client:
    """One connection to the daemon. Use as a context manager."""

    def __init__(self, root: str | os.PathLike[str], *, timeout_s: float = DEFAULT_TIMEOUT_S):
        self.root = Path(root).expanduser().absolute()
        self.socket_path = socket_path(self.root)
        self.timeout_s = timeout_s
        self._sock: socket.socket | None = None
        self._buffer = bytearray()
        self._ids = itertools.count(1)
        self._queued: deque[Notification] = deque()
        self.daemon_stopping = False
        """Set when the daemon announced a clean shutdown on this connection."""
        self.on_stopping: Callable[[str, dict[str, Any]], None] | None = None
        """Called with the method and the refusal's data when a stopping daemon refused a
        request it never ran (:func:`~substrat.rpc.starting.stopping_refusal`); once it
        returns (the next daemon serves) the request goes again on a new connection.
        :func:`connect_or_start` sets it; without it the refusal is raised."""

    # -- connection ----------------------------------------------------------

    def connect(self, timeout_s: float = CONNECT_TIMEOUT_S) -> Client:
        try:
            self._sock = connect(self.socket_path, timeout_s)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            check_socket(self.root)
            gone = isinstance(exc, FileNotFoundError)
            why = "no socket at {}" if gone else "{} refuses connections: its daemon is gone"
            raise DaemonNotRunningError(
                f"no daemon is running for root {self.root} ({why.format(self.socket_path)}); "
                f"start one with `substrat daemon start --root {shellword.shell_word(self.root)}`"
            ) from None
        except PermissionError:
            raise DaemonError(
                f"permission denied on {self.socket_path}: the root belongs to another user"
            ) from None
        except TimeoutError:
            raise RequestTimeoutError(
                f"the daemon at {self.socket_path} did not accept a connection within "
                f"{timeout_s:g}s; it may be overloaded (see {self.root / LOG_NAME})"
            ) from None
        return self

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None

    def __enter__(self) -> Client:
        if self._sock is None:
            self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- calls ---------------------------------------------------------------

    def call(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        timeout_s: float | None = None,
        on_notification: NotificationHandler | None = None,
        on_silence: Callable[[float], None] | None = None,
    ) -> Any:
        """Send one request and return its result; raise RpcError on an error answer.

        Notifications that arrive meanwhile go to ``on_notification`` or are kept
        for :meth:`next_notification`. ``on_silence(seconds)`` is called every
        SILENCE_CHECK_S the daemon says nothing (it may raise to give up sooner).
        A stopping daemon's refusal of a request it never ran goes to
        :attr:`on_stopping`, then the request to the next daemon (up to
        ``_RESENDS`` times).
        """
        for attempt in itertools.count():
            try:
                return self._call_once(method, params, timeout_s, on_notification, on_silence)
            except RpcError as exc:
                refusal = stopping_refusal(exc)
                if refusal is None or self.on_stopping is None or attempt >= _RESENDS:
                    raise
            self.close()
            self._buffer.clear()  # the old daemon's; the next connection starts afresh
            self.daemon_stopping = False
            self.on_stopping(method, refusal)
            self.connect()

    def _call_once(
        self,
        method: str,
        params: dict[str, Any] | None,
        timeout_s: float | None,
        on_notification: NotificationHandler | None,
        on_silence: Callable[[float], None] | None,
    ) -> Any:
        request_id = next(self._ids)
        self._send(protocol.request(method, params, request_id))
        limit = self.timeout_s if timeout_s is None else timeout_s
        while True:
            message = self._receive(limit, method, on_silence)
            if "method" in message and "id" not in message:
                self._on_notification(message, on_notification)
                continue
            if message.get("id") == request_id:
                return _result_of(message)
            if message.get("id") is None and "error" in message:
                # The daemon refused the connection or the line itself.
                return _result_of(message)

    def received_notifications(self) -> list[Notification]:
        """The notifications that came in during calls and were not taken yet (oldest
        first), without waiting for more: what a closed connection still has to tell."""
        queued = list(self._queued)
        self._queued.clear()
        return queued

    def next_notification(self, timeout_s: float) -> Notification | None:
        """The next notification, or None after ``timeout_s`` of silence."""
        if self._queued:
            return self._queued.popleft()
        try:
            message = self._receive(timeout_s, STREAM)
        except RequestTimeoutError:
            return None
        if "method" in message and "id" not in message:
            self._on_notification(message, None)
            return self._queued.popleft() if self._queued else None
        return None

    def _on_notification(
        self, message: dict[str, Any], handler: NotificationHandler | None
    ) -> None:
        method = str(message["method"])
        params = message.get("params")
        params = params if isinstance(params, dict) else {"params": params}
        if method == "daemon.stopping":
            self.daemon_stopping = True
        if handler is not None:
            handler(method, params)
        else:
            self._queued.append((method, params))

    # -- wire ----------------------------------------------------------------

    def _require_socket(self) -> socket.socket:
        if self._sock is None:
            self.connect()
        assert self._sock is not None
        return self._sock

    def _send(self, message: dict[str, Any]) -> None:
        try:
            line = protocol.encode(message)
        except UnicodeEncodeError:  # text that is not UTF-8: say which, where; nothing sent
            protocol.check_text(message.get("params"))
            raise
        sock = self._require_socket()
        try:
            sock.sendall(line)
        except (BrokenPipeError, ConnectionResetError):
            self._take_last_words(sock)
            raise self._died(str(message.get("method"))) from None

    def _take_last_words(self, sock: socket.socket) -> None:
        """Read the notifications a daemon sent before it closed the connection, when a
        request finds it closed: its ``daemon.stopping`` tells a clean stop from a death."""
        with contextlib.suppress(OSError):
            sock.setblocking(False)
            while len(self._buffer) <= MAX_MESSAGE_BYTES:
                data = sock.recv(1 << 16)
                if not data:
                    break
                self._buffer += data
        *lines, _partial = bytes(self._buffer).split(b"\n")
        self._buffer.clear()
        for line in lines:
            try:
                message = protocol.loads(line) if line.strip() else None
            except ValueError:
                continue
            if isinstance(message, dict) and "method" in message and "id" not in message:
                self._on_notification(message, None)

    def _receive(
        self, timeout_s: float, what: str, on_silence: Callable[[float], None] | None = None
    ) -> dict[str, Any]:
        sock = self._require_socket()
        heard = time.monotonic()
        deadline = heard + timeout_s
        while True:
            newline = self._buffer.find(b"\n")
            if newline >= 0:
                line = bytes(self._buffer[:newline])
                del self._buffer[: newline + 1]
                if not line.strip():
                    continue
                try:
                    message = protocol.loads(line)
                except ValueError as exc:
                    raise DaemonError(f"the daemon sent a line that is not JSON: {exc}") from None
                if isinstance(message, list):  # a batch answer: hand back the first
                    message = message[0] if message else {}
                if not isinstance(message, dict):
                    raise DaemonError("the daemon sent a message that is not a JSON object")
                return message
            if len(self._buffer) > MAX_MESSAGE_BYTES:
                raise DaemonError(f"the daemon sent a message over {MAX_MESSAGE_BYTES} bytes")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RequestTimeoutError(
                    f"no answer to {what} from the daemon within {timeout_s:g}s; it may be "
                    f"stuck (see {self.root / LOG_NAME}) or the turn may be slow (--timeout)"
                )
            sock.settimeout(min(remaining, SILENCE_CHECK_S) if on_silence else remaining)
            try:
                data = sock.recv(1 << 16)
            except TimeoutError:
                if on_silence is not None:
                    on_silence(time.monotonic() - heard)
                continue
            except (ConnectionResetError, BrokenPipeError):
                data = b""
            if not data:
                raise self._died(what)
            self._buffer += data

    def _died(self, what: str) -> DaemonDiedError | RootPermissionError:
        self.close()
        request = None if what == STREAM else what  # no request waiting: nothing half-done
        return died_error(self.root, self.socket_path, request, stopping=self.daemon_stopping)


def _result_of(message: dict[str, Any]) -> Any:
    if "error" in message:
        err = message["error"] if isinstance(message["error"], dict) else {}
        raise RpcError(
            int(err.get("code", protocol.INTERNAL_ERROR)),
            str(err.get("message", "unknown error")),
            err.get("data"),
        )
    return message.get("result")


# -- the daemon process -------------------------------------------------------


def ping(root: str | os.PathLike[str], timeout_s: float = 2.0) -> dict[str, Any] | None:
    """The daemon's ``ping`` answer, or None if none answers within ``timeout_s``."""
    try:
        with Client(root, timeout_s=timeout_s).connect(timeout_s) as client:
            result = client.call("ping")
    except (DaemonError, OSError):
        return None
    return result if isinstance(result, dict) else None


class DaemonProcess:
    """A daemon child process: start it, wait until it answers, kill or stop it.

    ``substrat daemon start`` uses it and lets go; tests keep it to SIGKILL the
    daemon at will. Output is appended to ``log_path`` (default
    ``<root>/daemon.log``). As a context manager it never leaves the process behind.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        daemon_args: list[str] | None = None,
        log_path: str | os.PathLike[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.root = Path(root).expanduser().absolute()
        self.daemon_args = list(daemon_args or [])
        self.log_path = Path(log_path) if log_path is not None else self.root / LOG_NAME
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    def start(self, timeout_s: float = START_TIMEOUT_S) -> DaemonProcess:
        """Spawn the daemon and return once it answers ``ping`` (DaemonStartError if not)."""
        check_serving(prepare_root(self.root))  # one line saying what to fix, not a log tail
        # -P: the working directory is not put on sys.path, so a directory named like one
        # of our packages there (a clone's parent holds ``substrat/``) is not what runs.
        command = [sys.executable, "-P", "-m", "substrat.daemon", "--root", str(self.root)]
        from substrat.deferred_signals import interrupts_held

        with open(self.log_path, "ab") as out, interrupts_held():
            since = out.tell()  # what this start writes: an older traceback is not its cause
            self.proc = self.spawn(command + self.daemon_args, out.fileno())
        if _wait_for_ping(self.root, timeout_s, self.proc) is None:
            code = self.proc.poll()
            if code is None:
                self.kill()
                state = f"did not answer within {timeout_s:g}s and was killed"
            else:
                state = f"exited with status {code}"
            raise DaemonStartError(
                f"the daemon for {self.root} {state}. Last lines of {self.log_path}:\n"
                f"{log_tail(self.log_path, since)}"
            )
        return self

    def spawn(self, command: list[str], log_fd: int) -> subprocess.Popen[bytes]:
        """Start ``command`` (stdin /dev/null, output to ``log_fd``, a session of its own,
        ``self.env``). An override may start an equal process another way (the tests fork
        it off a warm interpreter) with Popen's pid, poll, wait, kill and terminate."""
        import subprocess  # here: a command on a running daemon starts no process

        io: dict[str, Any] = {"stdin": subprocess.DEVNULL, "stdout": log_fd, "stderr": log_fd}
        return subprocess.Popen(command, **io, start_new_session=True, close_fds=True, env=self.env)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: no cleanup runs in the daemon, as in a crash or an OOM kill."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait()

    def terminate(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM and wait: the clean shutdown. Returns the exit status."""
        assert self.proc is not None, "not started"
        if self.proc.poll() is None:
            self.proc.terminate()
        import subprocess  # loaded already: it started the process

        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise DaemonError(
                f"daemon pid {self.proc.pid} ignored SIGTERM for {timeout_s:g}s; killed it"
            ) from None

    def wait(self, timeout_s: float) -> int:
        assert self.proc is not None, "not started"
        return self.proc.wait(timeout=timeout_s)

    def __enter__(self) -> DaemonProcess:
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


def start_daemon(
    root: str | os.PathLike[str],
    *,
    timeout_s: float = START_TIMEOUT_S,
    daemon_args: list[str] | None = None,
    create: bool = True,
    locked: bool = False,
) -> tuple[int, bool]:
    """Start a daemon in the background and wait until it answers ``ping``.

    Returns ``(pid, started)``: ``started`` is False when one was already
    running, or another process's start won the root first (that daemon is
    used). Its output goes to ``<root>/daemon.log``. The root is prepared
    first (:func:`~substrat.rootdir.prepare_root`; created only if ``create``):
    a path that cannot be a root raises a RootError with nothing written.
    Starts take the root's start lock (:mod:`substrat.rpc.starting`; ``locked``:
    the caller holds it). A root held by another process (an offline compact,
    a daemon still recovering) is waited for, up to ``timeout_s``. Raises
    DaemonStartError (with the log's tail) if the daemon exits or stays silent.
    """
    root_path = prepare_root(starting.refuse_held_root(root), create=create)  # held: no write
    answer = ping(root_path)
    if answer is not None and not answer.get("stopping"):
        return int(answer["pid"]), False
    deadline = time.monotonic() + timeout_s
    with contextlib.nullcontext() if locked else start_lock(root_path, timeout_s):
        while True:
            answer = ping(root_path)  # the start we waited for has served
            if answer is not None and not answer.get("stopping"):
                return int(answer["pid"]), False
            check_socket(root_path)
            if lock.is_held(root_path):
                # a daemon starting (recovery can take a while) or stopping, or offline work
                answer = _wait_for_ping(root_path, deadline - time.monotonic(), None)
                if answer is not None:
                    return int(answer["pid"]), False
                if lock.is_held(root_path):
                    raise DaemonStartError(busy_message(root_path, timeout_s))
            process = DaemonProcess(root_path, daemon_args=daemon_args)
            try:
                process.start(max(deadline - time.monotonic(), 1.0))
            except DaemonStartError:
                # Our daemon found the root taken (a daemon started without the start
                # lock, or a compact) and exited: use that one, or wait for it to end.
                if not lock.is_held(root_path) or time.monotonic() >= deadline:
                    raise
                continue
            return process.pid, True


def _wait_for_ping(
    root: Path, timeout_s: float, proc: subprocess.Popen[bytes] | None
) -> dict[str, Any] | None:
    deadline = time.monotonic() + timeout_s
    sock = socket_path(root)
    while time.monotonic() < deadline:
        answer = None
        # Until the daemon binds its socket (after its recovery) a ping can only fail, and
        # a failed one also looks for a daemon whose socket was removed (/proc/locks): 40-55
        # such pings were 15-19 ms of the 75-81 ms a start command spent after its imports.
        if os.path.exists(sock):
            answer = ping(root, timeout_s=min(2.0, max(0.1, deadline - time.monotonic())))
        # With a child to watch, only its own answer counts (another daemon may hold the root).
        if answer is not None and (proc is None or answer.get("pid") == proc.pid):
            return answer
        if proc is not None and proc.poll() is not None:
            return None
        if proc is None:  # another's daemon: it gave up the root, or will never answer
            check_socket(root)
            if not lock.is_held(root):
                return None
        time.sleep(_POLL_S)
    return None


def stop_daemon(root: str | os.PathLike[str], *, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
    """Stop the root's daemon cleanly; returns its pid once its process has exited, or
    None if none was running.

    Asks over RPC first, then sends SIGTERM to the pid the lock file names.
    Sessions are suspended (blobs saved) by the daemon before it exits.
    """
    root_path = Path(root).expanduser().absolute()
    deadline = time.monotonic() + timeout_s
    if not lock.is_held(root_path):
        # daemon.lock removed by hand under a live daemon: it still holds the root
        pid = unreachable_daemon(root_path)
        if pid is None:
            return None
        terminate(pid)
        if not wait_until(lambda: root_holder(root_path) != pid, timeout_s):
            raise not_stopped(pid, root_path, f"did not stop within {timeout_s:g}s")
        return exited(pid, deadline, root_path)
    info = lock.read_info(root_path)
    pid = info.pid if info is not None else None
    try:
        with Client(root_path, timeout_s=5.0).connect(2.0) as client:
            pid = int(client.call("daemon.shutdown")["pid"])
    except (DaemonError, OSError, KeyError, TypeError, ValueError):
        if pid is not None:
            terminate(pid)
    if not wait_until(lambda: not lock.is_held(root_path), timeout_s):
        raise not_stopped(pid, root_path, f"did not stop within {timeout_s:g}s")
    after = lock.read_info(root_path)
    if after is not None and after.state == "running":  # no clean stop's last write
        why = lock.read_only_note(root_path) or f"see {root_path / LOG_NAME} for why"
        raise DaemonStoppedUncleanlyError(
            f"the daemon (pid {pid}) exited without a clean shutdown; {why}. Nothing "
            "acknowledged is lost: the next start recovers the root (`substrat fsck` "
            "shows what it will do)"
        )
    return pid if pid is None else exited(pid, deadline, root_path)


def connect_or_start(
    root: str | os.PathLike[str],
    *,
    autostart: bool = True,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    on_start: Callable[[int], None] | None = None,
    create: bool = True,
) -> Client:
    """A connected client; starts the daemon first when none runs and ``autostart``.

    ``create=False`` never makes a root: starting a daemon then needs one there.
    """
    client = Client(root, timeout_s=timeout_s)

    def after_stop(method: str, refusal: dict[str, Any]) -> None:
        if not autostart:
            raise DaemonNotRunningError(refused_while_stopping(client.root, method, refusal))
        restart_after_stop(client.root, method, refusal, STOP_TIMEOUT_S, ping, start)

    def start(locked: bool = False) -> None:  # (locked: the caller holds the start lock)
        refusal = provider_env.autostart_refusal(root)  # another endpoint: not on demand
        if refusal is not None:
            raise DaemonNotRunningError(refusal)
        pid, started = start_daemon(root, create=create, locked=locked)
        if started and on_start is not None:
            on_start(pid)

    client.on_stopping = after_stop
    try:
        return client.connect()
    except DaemonNotRunningError:
        if not autostart:
            raise
    start()
    return client.connect()
