"""The serve loop of the tests' fork server (tests/support/warm.py starts it; read that first).

It runs as ``python -c <this file's text> SOCKET cli`` (the flags of a fresh ``python -c``
command, so ``sys.flags`` are a fresh command's; role ``daemon``: ``-P -c``, for the
daemons of tests/support/warm_daemons.py), with its working directory a private
empty one, so that nothing it imports comes from a directory a test made. It imports the
CLI once, then, for each request on the Unix socket, forks a child that becomes the
requested command: the child leaves :func:`serve` (none of the server's frames is left
below the command) and runs the command's code at the top level of this ``-c`` program,
so that its ``SystemExit``, an uncaught exception or a KeyboardInterrupt end the process
through the interpreter's own exit path (atexit, flushing, finalization), as in a fresh
process. Single-threaded, so that a fork copies no other thread's half-held lock.

Protocol (SOCK_SEQPACKET, one JSON message each way a step): the request carries four
descriptors (stdin, stdout, stderr, the working directory); the answers are
``{"pid": N}`` and then ``{"exit": CODE}`` (negative for a signal, as subprocess says).
The client may send ``kill`` (SIGKILL the child, which is then reported as usual); a
client that hangs up also gets its child killed, except a daemon's (mode ``m``: it runs
on, as a Popen child let go of does; its client got its pidfd with the pid, to signal
it). A command's child forks a zygote for the daemon it may start (:func:`fork_zygote`).
The server exits when its standard
input (a pipe the client holds) reaches end of file, killing children still running.
"""

import sys

# What the interpreter imported before it ran the command: a fresh process has these too,
# and the command's working directory could not have replaced them.
STARTUP_MODULES = set(sys.modules)

import gc  # noqa: E402
import importlib  # noqa: E402
import importlib.machinery  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import select  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import types  # noqa: E402
from typing import Any  # noqa: E402

START_VARIABLES = frozenset(
    {
        "LANG",
        "LANGUAGE",  # the locale, hence the standard streams' and the file system's encoding
        "HOME",  # the user site directory on sys.path
        "TZ",  # time.tzname, computed when time is imported
        "TMPDIR",
        "TEMP",
        "TMP",  # tempfile's directory, once computed
        "SETUPTOOLS_USE_DISTUTILS",  # read by distutils-precedence.pth
        "__PYVENV_LAUNCHER__",
    }
)
START_PREFIXES = ("PYTHON", "_PYTHON", "LC_")
"""Environment variables the interpreter (or a ``.pth`` file) reads when it starts. Neither
substrat, click nor rich reads the environment when imported (checked, session 27)."""


def start_environment(env: Any) -> dict[str, str] | None:
    """What of ``env`` the interpreter reads at start (None: not all keys are str)."""
    found = {}
    for key, value in env.items():
        if not isinstance(key, str) or not isinstance(value, str):
            return None
        if key in START_VARIABLES or key.startswith(START_PREFIXES):
            found[key] = value
    return found


def identity() -> tuple[Any, ...]:
    """What a process passes on to a child it starts, besides the environment."""
    import resource

    ignored = []
    for number in signal.valid_signals():
        try:
            if signal.getsignal(number) is signal.SIG_IGN:
                ignored.append(int(number))
        except (ValueError, OSError):
            pass
    limits = [getattr(resource, name) for name in dir(resource) if name.startswith("RLIMIT_")]
    return (
        os.getuid(),
        os.geteuid(),
        os.getgid(),
        os.getegid(),
        tuple(os.getgroups()),
        tuple(resource.getrlimit(limit) for limit in limits),
        tuple(sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, []))),
        tuple(ignored),
    )


def arg_area() -> tuple[int, int]:
    """Where this process's command line is in its memory (proc(5): arg_start, arg_end)."""
    with open("/proc/self/stat", "rb") as stat:
        fields = stat.read().rsplit(b")", 1)[1].split()
    return int(fields[45]), int(fields[46])


# What the CLI's commands load (collected from create, send, list with and without a
# table, show, fsck and stop): imported here once instead of in every command.
WARM = (
    "substrat.cli",
    "substrat.cli.agent_cmds",
    "substrat.cli.chat",
    "substrat.cli.compact_cmds",
    "substrat.cli.daemon_cmds",
    "substrat.cli.events_cmds",
    "substrat.cli.examples",
    "substrat.cli.explain",
    "substrat.cli.offline_cmds",
    "substrat.cli.render",
    "substrat.cli.turns",
    "substrat.client",
    "substrat.fsck",
    "substrat.fsck_repair",
    "substrat.fsck_report",
    "substrat.recovery",
    "substrat.rollforward",
    "substrat.incidents",
    "substrat.registry",
    "substrat.rpc.starting",
    "substrat.providers.registry",
    "rich.console",
    "rich.table",
)


def warm(names: tuple[str, ...] = WARM) -> dict[str, list[str]]:
    """Import ``names``; the top-level names imported since the start, with the files
    or directories they came from (what a client compares a command's ``sys.path[0]``
    against)."""
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:  # not warmed: the command imports it itself
            print(f"warm: {name}: {exc!r}", file=sys.stderr, flush=True)
    found: dict[str, list[str]] = {}
    for name, module in list(sys.modules.items()):
        if "." in name or name in STARTUP_MODULES or module is None:
            continue
        paths = list(getattr(module, "__path__", None) or [])
        origin = getattr(getattr(module, "__spec__", None), "origin", None)
        if not paths and origin not in (None, "built-in", "frozen"):
            paths = [origin]
        found[name] = [os.path.realpath(p) for p in paths]
    return found


# What a daemon's life loads (``python -P -m substrat.daemon``): the module and what its
# start and stop import on the way, ~26 of a forked daemon's ~50 ms (s29d), for the server
# of daemons and the CLI's (its zygotes).
WARM_DAEMON = ("substrat.daemon", "substrat.orchestrator", "substrat.recovery")
WARM_DAEMON += ("substrat.providers.fake", "substrat.providers.scripted", "substrat.process_end")


def warm_daemon() -> dict[str, list[str]]:
    """Import what the daemon imports, but not ``substrat.daemon`` itself: runpy runs its
    code as ``__main__`` (once, as in a fresh ``-m`` run, not a second copy of it)."""
    found = warm(WARM_DAEMON)
    sys.modules.pop("substrat.daemon", None)
    package = sys.modules.get("substrat")
    if package is not None and hasattr(package, "daemon"):
        delattr(package, "daemon")
    return found


class Child:
    def __init__(self, conn: socket.socket, pid: int, detached: bool) -> None:
        self.conn = conn
        self.pid = pid
        self.pidfd = os.pidfd_open(pid)
        self.hung_up = False
        # a daemon (``-m``): its client may let go of it (as of a Popen) and it runs on
        self.detached = detached


def serve(listener: socket.socket) -> dict[str, Any]:
    """Serve until the lifeline closes (then exit); in a forked child, return its request."""
    children: dict[int, Child] = {}  # by pid
    poller = select.poll()
    poller.register(0, select.POLLIN)
    poller.register(listener, select.POLLIN)
    by_fd: dict[int, Child] = {}
    while True:
        for fd, _ in poller.poll():
            if fd == 0:  # the client's end of the lifeline closed: the tests are over
                for child in children.values():
                    os.kill(child.pid, signal.SIGKILL)
                    _, status = os.waitpid(child.pid, 0)
                    answer(child.conn, {"exit": os.waitstatus_to_exitcode(status)})
                os._exit(0)
            if fd == listener.fileno():
                conn, _ = listener.accept()
                conn.settimeout(30)
                try:
                    data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 4)
                except OSError:
                    conn.close()
                    continue
                if len(fds) != 4 or not data:
                    for received in fds:
                        os.close(received)
                    conn.close()
                    continue
                request: dict[str, Any] = json.loads(data)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    listener.close()
                    conn.close()
                    for child in children.values():
                        child.conn.close()
                        os.close(child.pidfd)
                    request["fds"] = fds
                    return request
                for received in fds:
                    os.close(received)
                child = Child(conn, pid, detached=request["mode"] == "m")
                children[pid] = child
                by_fd[child.pidfd] = child
                by_fd[conn.fileno()] = child
                poller.register(child.pidfd, select.POLLIN)
                poller.register(conn, select.POLLIN)
                # A daemon's client gets its pidfd: it signals the very process, race-free,
                # whether or not this server has reaped it yet (as Popen's send_signal is).
                answer(conn, {"pid": pid}, [child.pidfd] if child.detached else [])
                continue
            child = by_fd[fd]
            if fd == child.pidfd:  # it exited
                _, status = os.waitpid(child.pid, 0)
                answer(child.conn, {"exit": os.waitstatus_to_exitcode(status)})
                poller.unregister(child.pidfd)
                del by_fd[child.pidfd], children[child.pid]
                os.close(child.pidfd)
                if not child.hung_up:
                    poller.unregister(child.conn)
                    del by_fd[child.conn.fileno()]
                child.conn.close()
            else:  # "kill", or the client hung up: the child is not reaped yet, so it is ours
                try:
                    message = child.conn.recv(64)
                except OSError:
                    message = b""
                if message or not child.detached:  # a daemon let go of runs on
                    os.kill(child.pid, signal.SIGKILL)
                child.hung_up = True  # its exit is reported through its pidfd
                poller.unregister(child.conn)
                del by_fd[child.conn.fileno()]


def answer(conn: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    try:
        if fds:
            socket.send_fds(conn, [json.dumps(message).encode()], fds)
        else:
            conn.send(json.dumps(message).encode())
    except OSError:  # the client is gone; the child is killed or reaped all the same
        pass


def become(request: dict[str, Any]) -> tuple[types.CodeType, dict[str, Any]]:
    """Make this forked child the requested process; the code to run and its globals."""
    if request["mode"] == "m":
        os.setsid()  # start_new_session, as DaemonProcess asks of Popen
    if "random" in sys.modules:  # not the state every child of this server would share
        sys.modules["random"].seed()
    stdin, stdout, stderr, cwd = request["fds"]
    for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
        os.dup2(fd, target)
    os.fchdir(cwd)
    for fd in (stdin, stdout, stderr, cwd):
        if fd > 2:
            os.close(fd)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # as close_fds: only 0, 1 and 2
    os.environ.clear()
    os.environ.update(request["env"])
    os.umask(request["umask"])
    argv: list[str] = request["argv"]
    namespace: dict[str, Any] = {"__name__": "__main__", "__doc__": None, "__package__": None}
    if request["mode"] == "c":
        code = compile(argv[2], "<string>", "exec")
        sys.argv = ["-c", *argv[3:]]
        sys.path[0] = ""
        sys.orig_argv = [sys.executable, *argv[1:]]
        namespace.update(__loader__=importlib.machinery.BuiltinImporter, __spec__=None)
    elif request["mode"] == "m":  # python -P -m MODULE ARGS...: runpy does the rest
        import runpy  # as a fresh -m run has it

        code = compile(f"_run_module_as_main({argv[3]!r})", "<string>", "exec")
        runner = {"_run_module_as_main": runpy._run_module_as_main, "__builtins__": __builtins__}
        sys.argv = ["-m", *argv[4:]]  # runpy puts the module's file first
        sys.orig_argv = [sys.executable, *argv[1:]]
        if not sys.flags.safe_path:  # a server without -P: its '' (the working directory)
            del sys.path[0]
        set_cmdline(argv)
        namespace.update(__loader__=importlib.machinery.BuiltinImporter, __spec__=None)
    else:
        interpreter, script = request["interpreter"], argv[0]
        with open(script, "rb") as source:
            code = compile(source.read(), script, "exec")
        sys.argv = list(argv)
        sys.orig_argv = [interpreter, *argv]
        sys.executable = interpreter
        sys.path[0] = os.path.dirname(os.path.realpath(script))
        loader = importlib.machinery.SourceFileLoader("__main__", script)
        namespace.update(__file__=script, __cached__=None, __loader__=loader, __spec__=None)
    namespace.update(__annotations__={}, __builtins__=__builtins__)
    main = types.ModuleType("__main__")
    main.__dict__.update(namespace)
    sys.modules["__main__"] = main
    sys.stdin, sys.stdout, sys.stderr = (
        stdio(0, "r", sys.stdin),
        stdio(1, "w", sys.stdout),
        stdio(2, "w", sys.stderr),
    )
    for name in ("stdin", "stdout", "stderr"):
        setattr(sys, f"__{name}__", getattr(sys, name))
    importlib.invalidate_caches()  # a directory listing cached before the fork is stale
    return code, runner if request["mode"] == "m" else main.__dict__


def set_cmdline(argv: list[str]) -> None:
    """Write ``argv`` over this process's own command line, what ``/proc/PID/cmdline`` (ps,
    and substrat's test of whether a root's holder is a daemon) reads; the rest of the
    server's longer one becomes NUL bytes. A client checks that it fits first."""
    start, end = arg_area()
    text = b"".join(os.fsencode(arg) + b"\0" for arg in argv)
    if len(text) > end - start:
        raise ValueError(f"the command line {argv!r} is longer than the server's")
    with open("/proc/self/mem", "r+b", buffering=0) as memory:
        memory.seek(start)
        memory.write(text.ljust(end - start, b"\0"))


def stdio(fd: int, mode: str, like: Any) -> io.TextIOWrapper:
    """A standard stream as the interpreter makes it at start (Python/pylifecycle.c,
    create_stdio): same encoding and errors as the server's (its environment's locale
    and PYTHONIOENCODING, which the client checked to be the command's), line-buffered
    if a terminal (stderr always), unbuffered under PYTHONUNBUFFERED."""
    unbuffered = bool(like.write_through)  # -u or PYTHONUNBUFFERED
    raw = io.FileIO(fd, mode + "b", closefd=False)
    buffer: Any = raw
    if not (unbuffered and mode == "w"):  # stdin is always buffered
        buffer = (io.BufferedReader if mode == "r" else io.BufferedWriter)(raw)
    stream = io.TextIOWrapper(
        buffer,
        encoding=like.encoding,
        errors=like.errors,
        newline="\n",
        line_buffering=not unbuffered and (raw.isatty() or fd == 2),
        write_through=unbuffered,
    )
    stream.mode = mode  # type: ignore[misc]
    raw.name = f"<{('stdin', 'stdout', 'stderr')[fd]}>"
    return stream


# The daemons a command's child starts (``DaemonProcess.spawn``): a zygote, forked off the
# child before the command runs (at the top level of this program, so that the daemon runs
# there too, under none of the command's frames), waits for the child's one daemon and
# becomes it. The daemon is then the command's own child, as a Popen child is.
DAEMON_COMMAND = ["-P", "-m", "substrat.daemon"]


def baseline() -> dict[str, Any]:
    """What this server's interpreter started with (a zygote's start, for a daemon)."""
    start, end = arg_area()
    return {
        "start": start_environment(os.environ),
        "identity": identity(),
        "executable": sys.executable,
        "arg_space": end - start,
    }


def fork_zygote(base: dict[str, Any]) -> dict[str, Any] | None:
    """Fork the zygote. In the command's child: install :func:`zygote_spawn`, return None.
    In the zygote: the daemon's request once the child sends one; exit without a trace
    when the child exits (or SIGKILL from its atexit) first."""
    name = f"\0substrat-warm-zygote-{os.getpid()}-{os.urandom(8).hex()}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(name)
    listener.listen(1)
    parent = os.getpid()
    pid = os.fork()
    if pid:
        listener.close()
        Zygote(pid, name, base).install()
        return None
    try:
        # Nothing of the command's: its pipes would not reach end of file while held here,
        # nor its directory be unmounted; the terminal's signals end it quietly.
        os.chdir("/")
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.close(null)
        held = {n: signal.getsignal(n) for n in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        for number in held:
            signal.signal(number, signal.SIG_DFL)
        watch = os.pidfd_open(parent)
        ready, _, _ = select.select([listener, watch], [], [])
        if watch in ready:
            os._exit(0)
        conn, _ = listener.accept()
        conn.settimeout(30)
        data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 4)
        request: dict[str, Any] = json.loads(data)
        request["fds"] = fds
        conn.send(b"{}")
        for held_open in (conn, listener):
            held_open.close()
        os.close(watch)
        for number, handler in held.items():
            signal.signal(number, handler)
        return request
    except BaseException:
        os._exit(127)


class Zygote:
    """The command's side of its zygote: ``DaemonProcess.spawn`` sends it the daemon."""

    def __init__(self, pid: int, name: str, base: dict[str, Any]) -> None:
        self.pid = pid
        self.name = name
        self.base = base
        self.used = False

    def install(self) -> None:
        client = sys.modules.get("substrat.client")
        if client is None:
            return
        fresh = client.DaemonProcess.spawn
        zygote = self

        def spawn(process: Any, command: list[str], log_fd: int) -> Any:
            reason = zygote.refusal(command, process.env)
            if reason is None:
                try:
                    return zygote.start(command, log_fd, process.env)
                except (OSError, ValueError) as exc:
                    reason = f"zygote failed: {exc!r}"
            count(f"daemon in a command: {reason}")
            return fresh(process, command, log_fd)

        spawn.zygote = zygote  # type: ignore[attr-defined]  # (for the tests of it)
        client.DaemonProcess.spawn = spawn
        import atexit

        atexit.register(self.end)

    def refusal(self, command: list[str], env: dict[str, str] | None) -> str | None:
        """Why this daemon starts fresh (None: it may be the zygote)."""
        if self.used:
            return "zygote used"
        interpreter = command[0]
        if command[1:4] != DAEMON_COMMAND or not all(isinstance(a, str) for a in command):
            return "program"
        here = self.base["executable"]
        if os.path.dirname(interpreter) != os.path.dirname(here) or (
            os.path.realpath(interpreter) != os.path.realpath(here)
        ):
            return "interpreter"
        if start_environment(os.environ if env is None else env) != self.base["start"]:
            return "environment"
        if identity() != self.base["identity"]:
            return "identity"
        if sum(len(os.fsencode(a)) + 1 for a in command) > self.base["arg_space"]:
            return "command line"
        return None

    def start(self, command: list[str], log_fd: int, env: dict[str, str] | None) -> "ChildDaemon":
        mask = os.umask(0o022)
        os.umask(mask)
        request = {
            "mode": "m",
            "argv": command,
            "env": dict(os.environ if env is None else env),
            "umask": mask,
        }
        null = os.open(os.devnull, os.O_RDONLY)
        directory = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            conn.settimeout(30)
            conn.connect(self.name)
            socket.send_fds(conn, [json.dumps(request).encode()], [null, log_fd, log_fd, directory])
            if conn.recv(64) != b"{}":
                raise ValueError("the zygote did not take the daemon")
        finally:
            conn.close()
            os.close(null)
            os.close(directory)
        self.used = True
        count("daemon in a command: warm")
        return ChildDaemon(command, self.pid)

    def end(self) -> None:
        """At the command's exit: an unused zygote is killed and reaped (no orphan)."""
        if not self.used:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)


def count(what: str) -> None:
    """With ``SUBSTRAT_TEST_WARM_COUNTS`` (a measurement), a JSON line of ``what``."""
    path = os.environ.get("SUBSTRAT_TEST_WARM_COUNTS")
    if path:
        with open(path, "a") as out:
            out.write(json.dumps({"pid": os.getpid(), what: 1}) + "\n")


class ChildDaemon:
    """A daemon that is this process's own child: Popen's pid, returncode, poll, wait,
    send_signal, terminate and kill, with waitpid as Popen has them."""

    def __init__(self, args: list[str], pid: int) -> None:
        self.args = args
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is not None:
            return self.returncode
        if timeout is None:
            self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
            return self.returncode
        import subprocess
        import time

        deadline = time.monotonic() + timeout
        delay = 0.0005
        while (code := self.poll()) is None:
            if time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            delay = min(delay * 2, 0.05, max(deadline - time.monotonic(), 0))
            time.sleep(delay)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # not reaped: the pid is still this child's
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


if __name__ == "__main__":
    # The CLI's server has the daemon's modules too, for the daemons its children start
    # (zygotes, below): a command's child costs no more for them (34.5 -> 34.9 ms, s28a).
    _found = warm_daemon() if sys.argv[2:] == ["daemon"] else (warm_daemon(), warm())[1]
    _baseline = baseline()
    _listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    _listener.bind(sys.argv[1])
    _listener.listen(64)
    # The line the client waits for: ready, with what it compares requests against.
    print(json.dumps({"pid": os.getpid(), "modules": _found}), flush=True)
    _null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(_null, 1)
    os.close(_null)
    # What the server made is never freed by a child's collections (the permanent
    # generation): a child's collector does not walk it, which would copy every page of
    # it (copy-on-write) into the child.
    gc.collect()
    gc.freeze()
    _request = serve(_listener)
    try:
        _code, _globals = become(_request)
        _daemon = None
        if _request["mode"] != "m":  # a command: a zygote for the daemon it may start
            _daemon = fork_zygote(_baseline)
            if _daemon is not None:  # this process is the zygote: it becomes that daemon
                _request = _daemon
                _code, _globals = become(_request)
    except BaseException as _exc:  # the command never ran: say why, as an exec failure would
        os.write(2, f"warm server: could not start {_request['argv']!r}: {_exc!r}\n".encode())
        os._exit(127)
    del _found, _null, _request, _listener, _baseline, _daemon
    exec(_code, _globals)
