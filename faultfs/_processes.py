"""Calls that would leave the simulated process, refused while a FaultFS is active.

One FaultFS is one simulated process. A forked child runs on a private copy of
the model that nobody checks or crashes, and its writes vanish with it; a child
started with a path under a root in its arguments, working directory or
environment sees the real directory there, not the simulated disk (empty, or
missing, so a recovery run there checks nothing). FIFOs and device nodes are
not in the model, and the real call would create them on the real disk. All are
refused with :class:`EscapeError` (recorded on the FaultFS, so explore and the
fixtures fail even when the code swallows it) or UnsupportedOperation.

Patched like the os functions, at activation (:func:`patches`): nothing runs per
simulated call.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from faultfs.errors import EscapeError, UnsupportedOperation

if TYPE_CHECKING:
    from faultfs._fs import FaultFS

Route = Callable[..., "tuple[FaultFS, str] | None"]

_WHERE = "docs/faultfs.md, 'Limits: what faultfs cannot see'"
# Characters that continue a file name: a root followed by one names another file.
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-~")


class _Context:
    """What the interceptor hands over at import: the active FaultFSes and its router."""

    stack: Sequence[FaultFS] = ()
    route: Route | None = None


_context = _Context()


def _refuse(fs: FaultFS, text: str) -> EscapeError:
    fs.escapes.append(text)  # recorded: explore and the fixtures fail even if swallowed
    return EscapeError(text)


# ------------------------------------------------------------------------- fork


def _fork_message(call: str, fs: FaultFS) -> str:
    return (
        f"{call} while the FaultFS at {fs.root!r} is active: the child would run on its own "
        "copy of the simulated disk, which nothing checks or crashes (its writes vanish with "
        "it; multiprocessing's 'fork' start method forks too). One FaultFS simulates one "
        "process. For the test, run the child's work in this process (call it directly, or "
        "in a thread: threads share the FaultFS), or test the multi-process code on a real "
        f"kernel (a killed child process; LazyFS for power loss: docs/lazyfs.md; {_WHERE})."
    )


def _fork() -> int:
    raise _refuse(_context.stack[-1], _fork_message("os.fork()", _context.stack[-1]))


def _forkpty() -> tuple[int, int]:
    raise _refuse(_context.stack[-1], _fork_message("os.forkpty()", _context.stack[-1]))


# ------------------------------------------------------- child processes on a root


def _names_root(text: str, root: str) -> bool:
    start = text.find(root)
    while start >= 0:
        end = start + len(root)
        before = text[start - 1] if start else ""
        after = text[end] if end < len(text) else ""
        if before not in _NAME_CHARS and (after == "/" or after not in _NAME_CHARS):
            return True
        start = text.find(root, start + 1)
    return False


def _texts(value: Any) -> Iterable[str]:
    if value is None:
        return
    if isinstance(value, str | bytes | os.PathLike):
        try:
            yield os.fsdecode(os.fspath(value))
        except TypeError:
            return
        return
    if isinstance(value, dict | os._Environ):
        for item in value.values():
            yield from _texts(item)
        return
    if isinstance(value, list | tuple):
        for item in value:
            yield from _texts(item)


# Set by the shell that started the program, about its own directory: an inherited copy
# tells the child nothing (the child runs in this process's real directory, not there).
_SHELL_ONLY = ("PWD", "OLDPWD")


def _inherited() -> dict[str, str]:
    """The environment a child given ``env=None`` inherits, less what only the shell set."""
    return {k: v for k, v in os.environ.items() if k not in _SHELL_ONLY}


def _check_child(call: str, args: Any, cwd: Any = None, env: Any = None) -> None:
    """Refuse a child process that is told a path under an active root."""
    stack = _context.stack
    if not stack:
        return
    named = (("its arguments", args), ("its working directory", cwd))
    for where, value in (*named, ("its environment", _inherited() if env is None else env)):
        for text in _texts(value):
            for fs in reversed(stack):
                if _names_root(text, fs.root):
                    raise _refuse(fs, _child_message(call, where, text, fs))


def _child_message(call: str, where: str, text: str, fs: FaultFS) -> str:
    shown = text if len(text) <= 120 else text[:117] + "..."
    return (
        f"{call}: {where} name {shown!r}, under the FaultFS root {fs.root!r}, but a child "
        "process sees the real file system, not the simulated disk (one FaultFS simulates "
        "one process): there it finds the real directory (empty, or missing), so a recovery "
        "or check run there checks nothing, and what it writes is never crashed. Run that "
        "code in this process instead (import the recovery or tool and call it: inside "
        "recover_and_check it then reads the crash image). To hand a crash image to a real "
        "program, copy it out first (img.tree() maps each path to its bytes) to a directory "
        f"outside the root, with outside='passthrough' ({_WHERE})."
    )


_real_execute_child = getattr(subprocess.Popen, "_execute_child", None)


def _execute_child(
    self: Any, args: Any, executable: Any, preexec_fn: Any, close_fds: Any, pass_fds: Any,
    cwd: Any, env: Any, *rest: Any, **kwargs: Any,
) -> Any:  # fmt: skip
    _check_child("subprocess.Popen", [args, executable], cwd, env)
    assert _real_execute_child is not None
    return _real_execute_child(
        self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env, *rest, **kwargs
    )


def _spawn_checker(name: str) -> Callable[..., Any]:
    real = getattr(os, name)
    with_env = name.startswith("posix_spawn") or name.endswith("e")

    def spawn(path: Any, argv: Any = None, env: Any = None, *args: Any, **kwargs: Any) -> Any:
        _check_child(f"os.{name}", [path, argv], None, env if with_env else None)
        if argv is None:
            return real(path, *args, **kwargs)
        if with_env:
            return real(path, argv, env, *args, **kwargs)
        return real(path, argv, *args, **kwargs)

    spawn.__name__ = name
    return spawn


def _system(command: Any) -> int:
    _check_child("os.system", command)
    return _real_system(command)


_real_system = os.system


# ------------------------------------------------------------ FIFOs and device nodes


def _node_refuser(name: str, what: str) -> Callable[..., Any]:
    real = getattr(os, name)

    def make(path: Any, *args: Any, dir_fd: int | None = None, **kwargs: Any) -> Any:
        route = _context.route
        if route is not None and route(path, dir_fd) is not None:
            raise UnsupportedOperation(
                f"os.{name}({path!r}): faultfs does not model {what}, and the real call would "
                "create one in the real directory under the root; create it outside the root"
            )
        return real(path, *args, dir_fd=dir_fd, **kwargs)

    make.__name__ = name
    return make


def patches(stack: Sequence[FaultFS], route: Route) -> list[tuple[Any, str, Any]]:
    """(namespace, name, replacement) to install while a FaultFS is active."""
    _context.stack, _context.route = stack, route
    found: list[tuple[Any, str, Any]] = [(os, "fork", _fork), (os, "system", _system)]
    if hasattr(os, "forkpty"):
        found.append((os, "forkpty", _forkpty))
    for name in ("execv", "execve", "posix_spawn", "posix_spawnp"):
        if hasattr(os, name):
            found.append((os, name, _spawn_checker(name)))
    if _real_execute_child is not None:
        found.append((subprocess.Popen, "_execute_child", _execute_child))
    found.append((os, "mkfifo", _node_refuser("mkfifo", "FIFOs")))
    if hasattr(os, "mknod"):
        found.append((os, "mknod", _node_refuser("mknod", "device nodes or FIFOs")))
    return found
