"""A fork server for the tests' ``substrat`` command processes: ``run`` is ``subprocess.run``.

A ``substrat`` command the tests run costs about 0.1 CPU s, nine tenths of it the
interpreter's start and the imports, not the command (docs/benchmarks.md). :func:`run`
runs such a command in a child forked off a server process (tests/support/warm_server.py)
that paid for the start and the imports once, per pytest process (each xdist worker has
its own). The child is a real process of its own, as the test asked for: its
stdin/stdout/stderr are the descriptors :func:`run` passes it (``SCM_RIGHTS``), it has the
requested working directory, environment (``os.environ`` replaced) and umask, and
``sys.argv`` as a fresh command has it; it exits through the interpreter's exit path,
and its exit status comes back negative for a signal, as ``subprocess`` reports it.

Wherever a fresh interpreter could start differently, :func:`run` runs a fresh process
with ``subprocess.run`` instead: a ``preexec_fn`` or an argument it does not handle; a
program that is not this interpreter's ``-c`` or a script of it; an environment that
differs from the server's in what the interpreter or a ``.pth`` file reads at start
(:data:`START_VARIABLES`, :data:`START_PREFIXES`); a directory first on the command's
``sys.path`` (the working directory of a ``-c``, a script's own) holding an entry named
like a module the server imported, unless it is that very module; another uid, gid,
resource limit, signal mask or ignored signal than the server was started with; and,
everywhere, ``SUBSTRAT_TEST_FRESH_PROCESSES=1`` in the tests' environment (the nightly
workflow runs with it, so that fresh processes stay covered: docs/testing.md).

Known differences that remain: the child's parent is the server, not pytest; it shares
the server's string hash seed; an uncaught exception's traceback has one more frame (the
server's ``<string>`` module) at its top; the server's objects are in the collector's
permanent generation (``gc.freeze``: a child's collections would otherwise walk, and so
copy, every page of them; that halved a child's CPU, 53 -> 26 ms for ``pass``); and the
modules the server imported are loaded already, the daemon's too (a test of what a command
imports, such as test_cli_startup.py, runs fresh processes itself); and while the command
runs it has one child more, the zygote its daemon would be forked from (tests/support/
warm_server.py), killed and reaped at the command's exit if no daemon needed it.
"""

from __future__ import annotations

import atexit
import collections
import ctypes
import importlib.machinery
import io
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.warm_server import identity, start_environment

FRESH = "SUBSTRAT_TEST_FRESH_PROCESSES"

START_LIMIT_S = 60.0  # for the server's start and imports, on a machine at load 20
REPLY_LIMIT_S = 30.0  # for the server's answers that need no command to finish
SERVER_SOURCE = (Path(__file__).parent / "warm_server.py").read_text()


def inherited_environment() -> dict[str, str]:
    """The environment a child started with ``env=None`` inherits: the C library's, which
    can hold what ``os.environ`` does not (readline, which pytest loads, sets COLUMNS and
    LINES there)."""
    found: dict[str, str] = {}
    index = 0
    while (entry := _C_ENVIRON[index]) is not None:
        key, _, value = entry.partition(b"=")
        found[os.fsdecode(key)] = os.fsdecode(value)
        index += 1
    return found


_C_ENVIRON = ctypes.POINTER(ctypes.c_char_p).in_dll(ctypes.CDLL(None), "environ")


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    directory: str
    socket_path: str
    lifeline: int  # the write end of the server's stdin: closed, the server exits
    owner: int  # the pid of the process that started it
    modules: dict[str, list[str]]  # top-level name -> realpaths it came from

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        if os.getpid() != self.owner:
            return
        try:
            os.close(self.lifeline)
        except OSError:
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        if self.process.stdout is not None:
            self.process.stdout.close()
        shutil.rmtree(self.directory, ignore_errors=True)


# The server starts with what the tests' process had when it imported this module (after
# conftest's set-up, before any test's monkeypatch): a command whose start would differ
# from it runs fresh, and a test's change of the environment cannot change the server.
_BASELINE_ENV = inherited_environment()
_BASELINE_START = start_environment(_BASELINE_ENV) or {}
_BASELINE_IDENTITY = identity()
_servers: dict[str, Server] = {}  # by role: "cli" (``-c``), "daemon" (``-P -c``)
_failed_starts: collections.Counter[str] = collections.Counter()  # a failing role: not again
MAX_FAILED_STARTS = 3
_scripts: dict[str, str | None] = {}  # script path -> its interpreter, if it is this one


def _start(role: str) -> Server | None:
    directory = tempfile.mkdtemp(prefix="substrat-warm-")
    socket_path = os.path.join(directory, "s")
    read_end, lifeline = os.pipe()
    with open(os.path.join(directory, "server.log"), "wb") as log:
        # the daemons' server runs with -P, as DaemonProcess starts a daemon
        flags = ["-P"] if role == "daemon" else []
        process = subprocess.Popen(
            [sys.executable, *flags, "-c", SERVER_SOURCE, socket_path, role],
            stdin=read_end,
            stdout=subprocess.PIPE,
            stderr=log,
            cwd=directory,
            env=_BASELINE_ENV,
        )
    os.close(read_end)
    server = Server(process, directory, socket_path, lifeline, os.getpid(), modules={})
    assert process.stdout is not None
    line = b""
    deadline = time.monotonic() + START_LIMIT_S
    fd = process.stdout.fileno()
    while not line.endswith(b"\n") and (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([fd], [], [], left)
        chunk = os.read(fd, 1 << 20) if ready else b""
        if not chunk:
            break
        line += chunk
    try:
        ready_line = json.loads(line)
    except ValueError:
        _failed_starts[role] += 1
        server.process.kill()
        server.stop()
        return None
    server.modules = ready_line["modules"]
    return server


def get_server(role: str = "cli") -> Server | None:
    """This process's server of ``role`` (started if need be; None if it cannot start)."""
    server = _servers.get(role)
    if server is not None and (server.owner != os.getpid() or not server.alive()):
        if server.owner == os.getpid():
            server.stop()
        del _servers[role]
    if role not in _servers and _failed_starts[role] < MAX_FAILED_STARTS:
        started = _start(role)
        if started is not None:
            _servers[role] = started
    return _servers.get(role)


def shutdown() -> None:
    """Stop this process's server (at the end of the tests; atexit does it too). With
    ``SUBSTRAT_TEST_WARM_COUNTS`` naming a file, append :data:`counts` to it (a JSON line)."""
    if counts and (path := os.environ.get("SUBSTRAT_TEST_WARM_COUNTS")):
        with open(path, "a") as out:
            out.write(json.dumps({"pid": os.getpid(), **counts}) + "\n")
        counts.clear()
    for role in list(_servers):
        _servers.pop(role).stop()


atexit.register(shutdown)


def _interpreter_of(script: str) -> str | None:
    """The interpreter of ``script``'s ``#!`` line if it is this one (a venv's
    ``python3`` beside its ``python``), else None."""
    if script not in _scripts:
        found = None
        try:
            with open(script, "rb") as handle:
                first = handle.readline(512)
        except OSError:
            first = b""
        if first.startswith(b"#!") and len(first.split()) == 1:
            interpreter = first[2:].strip().decode(errors="replace")
            here = sys.executable
            if interpreter == here or (
                os.path.dirname(interpreter) == os.path.dirname(here)
                and os.path.realpath(interpreter) == os.path.realpath(here)
            ):
                found = interpreter
        _scripts[script] = found
    return _scripts[script]


def _shadows(directory: str, modules: dict[str, list[str]]) -> bool:
    """Whether ``directory``, first on a fresh command's ``sys.path``, holds a package or
    module a fresh import of an already imported module would find instead of the
    server's (a clone of the project in the working directory, say)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return False  # gone or unreadable: a fresh import finds nothing there either
    real = os.path.realpath(directory)
    for entry in names:
        path = os.path.join(real, entry)
        if entry in modules:
            name = entry if os.path.isdir(path) else ""
        else:
            name = next((entry[: -len(s)] for s in _SUFFIXES if entry.endswith(s)), "")
        if name in modules and os.path.realpath(path) not in modules[name]:
            return True
    return False


_SUFFIXES = tuple(importlib.machinery.all_suffixes())


_SUPPORTED = frozenset(
    {
        "input",
        "capture_output",
        "stdin",
        "stdout",
        "stderr",
        "text",
        "universal_newlines",
        "encoding",
        "errors",
        "timeout",
        "check",
        "env",
        "cwd",
        "preexec_fn",
    }
)


def _plan(args: Any, kwargs: dict[str, Any]) -> tuple[Server, str, str | None] | str:
    """The server, mode and interpreter to run ``args`` warm with; or why it runs fresh."""
    if os.environ.get(FRESH) == "1":
        return FRESH
    if kwargs.get("preexec_fn") is not None or not set(kwargs) <= _SUPPORTED:
        return "arguments"
    if not isinstance(args, (list, tuple)) or not args or not all(isinstance(a, str) for a in args):
        return "program"
    if len(args) >= 3 and args[0] == sys.executable and args[1] == "-c":
        mode, interpreter = "c", None
        first_on_path = str(kwargs.get("cwd") or ".")
    elif os.path.isabs(args[0]) and (interpreter := _interpreter_of(args[0])) is not None:
        mode = "script"
        first_on_path = os.path.dirname(os.path.realpath(args[0]))
    else:
        return "program"
    env = kwargs.get("env")
    if start_environment(inherited_environment() if env is None else env) != _BASELINE_START:
        return "environment"
    if identity() != _BASELINE_IDENTITY:
        return "identity"
    server = get_server()
    if server is None:
        return "no server"
    if _shadows(first_on_path, server.modules):
        return "sys.path[0]"
    return server, mode, interpreter


counts: collections.Counter[str] = collections.Counter()
"""Commands run warm (``warm``) and fresh (by reason), in this process."""


def run(args: Any, **kwargs: Any) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run(args, **kwargs)``, in a child of the warm server where that
    cannot differ from a fresh process (see the module's docstring)."""
    plan = _plan(args, kwargs)
    if not isinstance(plan, str):
        try:
            result = run_warm(*plan, list(args), **kwargs)[1]
        except Unavailable:  # before the command started: the server is restarted next time
            plan[0].process.kill()
            plan = "server gone"
        else:
            counts["warm"] += 1
            return result
    counts[plan] += 1
    return subprocess.run(args, **kwargs)


class Unavailable(RuntimeError):
    """The server did not take the command (it ran nowhere)."""


def run_warm(
    server: Server,
    mode: str,
    interpreter: str | None,
    args: list[str],
    *,
    input: Any = None,
    capture_output: bool = False,
    stdin: Any = None,
    stdout: Any = None,
    stderr: Any = None,
    text: bool | None = None,
    universal_newlines: bool | None = None,
    encoding: str | None = None,
    errors: str | None = None,
    timeout: float | None = None,
    check: bool = False,
    env: dict[str, str] | None = None,
    cwd: Any = None,
    preexec_fn: None = None,
) -> tuple[int, subprocess.CompletedProcess[Any]]:
    """Run ``args`` in a child of ``server``; its pid and the ``subprocess.run`` result."""
    if capture_output:
        if stdout is not None or stderr is not None:
            raise ValueError("stdout and stderr arguments may not be used with capture_output.")
        stdout = stderr = subprocess.PIPE
    if input is not None:
        if stdin is not None:
            raise ValueError("stdin and input arguments may not both be used.")
        stdin = subprocess.PIPE
    text_mode = bool(encoding or errors or text or universal_newlines)
    ours: list[int] = []  # descriptors to close here once the child has them
    theirs: list[int] = []

    def child_end(spec: Any, fd: int, reading: bool) -> tuple[int, int | None]:
        """The child's descriptor for ``spec``, and the pipe end kept here (if a pipe)."""
        if spec is None:
            return fd, None
        if spec == subprocess.DEVNULL:
            null = os.open(os.devnull, os.O_RDONLY if reading else os.O_WRONLY)
            theirs.append(null)
            return null, None
        if spec == subprocess.PIPE:
            read_end, write_end = os.pipe()
            theirs.append(read_end if reading else write_end)
            ours.append(write_end if reading else read_end)
            return theirs[-1], ours[-1]
        if isinstance(spec, int):
            return spec, None
        return spec.fileno(), None

    in_fd, _ = child_end(stdin, 0, True)  # its pipe end, if any, is in ours
    out_fd, from_out = child_end(stdout, 1, False)
    if stderr == subprocess.STDOUT:
        err_fd, from_err = out_fd, None
    else:
        err_fd, from_err = child_end(stderr, 2, False)
    directory = os.open(os.fspath(cwd) if cwd is not None else ".", os.O_RDONLY | os.O_DIRECTORY)
    theirs.append(directory)
    mask = os.umask(0o022)
    os.umask(mask)
    request = {
        "mode": mode,
        "argv": args,
        "interpreter": interpreter,
        "env": inherited_environment() if env is None else {**env},
        "umask": mask,
    }
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.settimeout(REPLY_LIMIT_S)
        conn.connect(server.socket_path)
        socket.send_fds(conn, [json.dumps(request).encode()], [in_fd, out_fd, err_fd, directory])
        pid = json.loads(conn.recv(1 << 16))["pid"]
    except (OSError, ValueError, KeyError) as exc:
        for fd in theirs + ours:
            os.close(fd)
        conn.close()
        raise Unavailable(f"the warm server did not start {args!r}: {exc!r}") from exc
    for fd in theirs:
        os.close(fd)
    try:
        code, out, err, timed_out = _communicate(
            conn, input, text_mode, encoding, errors, ours, from_out, from_err, timeout
        )
    finally:
        conn.close()
        for fd in ours:
            os.close(fd)
    if timed_out:
        raise subprocess.TimeoutExpired(args, timeout or 0, output=out, stderr=err)
    shown: list[Any] = [out, err]
    if text_mode:
        shown = [None if data is None else _decode(data, encoding, errors) for data in shown]
    if check and code:
        raise subprocess.CalledProcessError(code, args, output=shown[0], stderr=shown[1])
    return pid, subprocess.CompletedProcess(args, code, *shown)


def _decode(data: bytes, encoding: str | None, errors: str | None) -> str:
    """As ``subprocess`` decodes a text-mode pipe (universal newlines)."""
    return io.TextIOWrapper(io.BytesIO(data), encoding=encoding, errors=errors).read()


def _communicate(
    conn: socket.socket,
    input: Any,
    text_mode: bool,
    encoding: str | None,
    errors: str | None,
    ours: list[int],
    from_out: int | None,
    from_err: int | None,
    timeout: float | None,
) -> tuple[int, bytes | None, bytes | None, bool]:
    """Feed ``input``, gather the output until the pipes close and the exit is reported;
    SIGKILL the child (through the server) at ``timeout``. A pipe end closed here leaves
    ``ours`` (the caller closes the rest)."""
    to_child = next((fd for fd in ours if fd not in (from_out, from_err)), None)

    def close(fd: int) -> None:
        ours.remove(fd)
        os.close(fd)

    if input is not None and text_mode:
        probe = io.TextIOWrapper(io.BytesIO(), encoding=encoding, errors=errors)
        input = input.encode(probe.encoding, probe.errors)
    pending = memoryview(bytes(input or b""))
    gathered: dict[int, list[bytes]] = {fd: [] for fd in (from_out, from_err) if fd is not None}
    reading = set(gathered)
    writing = {to_child} if to_child is not None else set()
    if to_child is not None and not pending:
        close(to_child)
        writing.clear()
    status: int | None = None
    deadline = None if timeout is None else time.monotonic() + timeout
    killed_at: float | None = None
    conn_fd = conn.fileno()
    while status is None or reading:
        now = time.monotonic()
        if deadline is not None and now >= deadline and killed_at is None:
            killed_at = now
            try:
                conn.send(b"kill")
            except OSError:
                pass
            for fd in writing:
                close(fd)
            writing.clear()
        if killed_at is not None:
            # After the kill, subprocess.run waits for the exit, not for the pipes to close.
            if status is not None:
                break
            if now - killed_at > REPLY_LIMIT_S:
                raise RuntimeError("the warm server did not report its killed child's exit")
        if deadline is not None and killed_at is None:
            wait: float | None = max(deadline - now, 0)
        else:
            wait = 1.0 if killed_at is not None else None
        watched = [*reading, *([conn_fd] if status is None else [])]
        readable, writable, _ = select.select(watched, list(writing), [], wait)
        for fd in writable:
            try:
                written = os.write(fd, pending[: select.PIPE_BUF])
            except BrokenPipeError:
                written = len(pending)
            pending = pending[written:]
            if not pending:
                close(fd)
                writing.clear()
        for fd in readable:
            if fd == conn_fd:
                message = conn.recv(1 << 16)
                if not message:
                    raise RuntimeError("the warm server died while its child ran")
                status = int(json.loads(message)["exit"])
                continue
            chunk = os.read(fd, 1 << 16)
            if chunk:
                gathered[fd].append(chunk)
            else:
                reading.discard(fd)
    out = b"".join(gathered[from_out]) if from_out is not None else None
    err = b"".join(gathered[from_err]) if from_err is not None else None
    assert status is not None
    return status, out, err, killed_at is not None
