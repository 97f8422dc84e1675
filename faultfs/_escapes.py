"""Escapes: the ways code reaches the real file system around the patched os/io attributes.

* Names bound before activation (``from os import fsync``, ``_replace =
  os.replace``, ``from sqlite3 import connect``) in loaded modules and their
  classes: :func:`patch_bindings` finds them, as pyfakefs does, and points them
  at the interceptors while a FaultFS is active. Modules are scanned once; the
  scan is redone only for modules loaded since. Names that modules imported
  during the run bound to an interceptor point at the original again at the
  outermost exit (:func:`unbind_run`): module and class attributes hold
  faultfs's functions only while a FaultFS is active.
* References no scan can reach (instance attributes, closures, default
  arguments): when the root is a real directory, a path-taking call that
  reaches the real system for a path under an active root is stopped by an
  audit hook (:func:`sys.addaudithook`) with :class:`EscapeError`; a simulated
  descriptor handed to the real os fails with ``EBADF``, and a path under a
  simulated root fails on the real disk (``ENOENT``), both of which
  :func:`diagnose` turns into the same error. Each names the function
  (``module:qualname``), the name it used and the fix.
* Objects of a crashed run: :func:`bury` clears the crashed frames and collects
  them while the dead model is still active, so their finalizers meet the dead
  process (their I/O is refused) instead of the real disk.
"""

from __future__ import annotations

import contextlib
import dis
import errno
import gc
import os
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from types import BuiltinFunctionType, FrameType, FunctionType, ModuleType, TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from faultfs._handoff import numpy_handoff, unseen_read
from faultfs.errors import EscapeError, SimulatedCrash

if TYPE_CHECKING:
    from faultfs._fs import FaultFS

# Modules whose bindings must stay real: the interceptor's own, the modules it
# patches by attribute, the import system, and the source readers tracebacks use.
_SKIP_MODULES = frozenset(
    {
        "os", "posix", "nt", "builtins", "io", "_io", "fcntl", "sys", "posixpath",
        "genericpath", "linecache", "tokenize", "importlib", "zipimport", "faultfs",
    }
)  # fmt: skip
_SKIP_PREFIXES = ("faultfs.", "importlib.", "_frozen_importlib", "encodings.")

T = TypeVar("T")

# Binding: (namespace, name, original, replacement); namespace is a module or class.
Binding = tuple[Any, str, Any, Any]

# id(original) -> (original, replacement, "os.fsync")
_originals: dict[int, tuple[Any, Any, str]] = {}
# id(replacement) -> (replacement, original, "os.fsync"): what unbind_run points back
_replacements: dict[int, tuple[Any, Any, str]] = {}
# The types originals have (builtins; mmap.mmap is a class): a type check first keeps
# the scan cheap.
_original_types: set[type] = {BuiltinFunctionType}
_scanned: dict[str, Any] = {}
_found: dict[str, list[Binding]] = {}
_flat: list[Binding] = []
_seen: tuple[int, object] = (-1, None)
_at_activation: tuple[int, object] = (-1, None)


def register(original: Any, replacement: Any, qualname: str) -> None:
    """Declare ``original`` (a builtin such as os.fsync) and the interceptor that replaces it."""
    assert isinstance(original, BuiltinFunctionType), qualname
    _add(original, replacement, qualname)


def _add(original: Any, replacement: Any, qualname: str) -> None:
    _originals.setdefault(id(original), (original, replacement, qualname))
    _replacements.setdefault(id(replacement), (replacement, original, qualname))


def not_binding(original: Any, replacement: Any) -> Any:
    """``replacement`` as a callable that, like the builtin ``original``, is no method.

    A class body run while a FaultFS is active (a module the run imports) that says
    ``_sync = os.fsync`` holds faultfs's version; a plain function there binds as a
    method, and ``self._sync(fd)`` would pass ``self`` as the descriptor where the
    builtin passes ``fd``. A :class:`staticmethod` does not bind, and is callable
    itself (3.10+). Not :func:`functools.partial`: Python 3.13 warns at every call
    of one found on a class (FutureWarning, an error under ``-W error``), and 3.14
    makes it bind like a function.
    """
    if not isinstance(original, BuiltinFunctionType) or type(replacement) is not FunctionType:
        return replacement
    # staticmethod copies the function's name and doc, and its __wrapped__ is the
    # replacement, whose own __wrapped__ is the original (inspect.unwrap gets there)
    return staticmethod(replacement)


def wrapper(original: Any, make: Callable[[], Any], qualname: str) -> tuple[Any, bool]:
    """(the one replacement of a C store's ``original``, whether it is new).

    One per original for the process, and registered like the os functions: names
    bound to the original (``from sqlite3 import connect`` before activation) are
    rebound by the scan, and names bound to the replacement during a run are pointed
    back by :func:`unbind_run`.
    """
    hit = _originals.get(id(original))
    if hit is not None and hit[0] is original:
        return hit[1], False
    global _seen
    replacement = make()
    _add(original, replacement, qualname)
    _original_types.add(type(original))
    _scanned.clear()  # a new original: the next activation scans every module for it again
    _found.clear()
    _seen = (-1, None)
    return replacement, True


def bound_to(originals: list[Any]) -> list[tuple[Any, str, Any]]:
    """(namespace, name, replacement) for each module or class name holding one of ``originals``.

    A scan of its own, not bindings()'s cache: it runs while a FaultFS is active, when
    the names patch_bindings rebound hold replacements, which that cache must not record.
    """
    wanted = {id(original) for original in originals}
    patches: list[tuple[Any, str, Any]] = []
    for name, module in list(sys.modules.items()) if wanted else ():
        for namespace, attr, original, replacement in _read(name, module, _scan) or ():
            held = original.__func__ if type(original) is staticmethod else original
            if id(held) in wanted:
                patches.append((namespace, attr, replacement))
    return patches


def _skipped(name: str) -> bool:
    return name in _SKIP_MODULES or name.startswith(_SKIP_PREFIXES)


def _read(name: str, module: Any, reader: Callable[[ModuleType], T]) -> T | None:
    """``reader(module)`` for a loaded module faultfs may look into, else None."""
    if not isinstance(module, ModuleType) or _skipped(name):
        return None
    try:
        return reader(module)
    except Exception:  # an exotic module (lazy loader, proxy): leave it alone
        return None


def _hit(value: Any) -> tuple[Any, Any, str] | None:
    if type(value) not in _original_types:
        return None
    hit = _originals.get(id(value))
    return hit if hit is not None and hit[0] is value else None


def _scan(module: ModuleType) -> list[Binding]:
    """The module's (and its classes') attributes that hold an original function."""
    found: list[Binding] = []
    name = module.__name__
    for attr, value in list(vars(module).items()):
        hit = _hit(value)
        if hit is not None:
            found.append((module, attr, value, hit[1]))
        # issubclass on the value's type, not isinstance on the value: isinstance asks a
        # proxy for its __class__, and a lazy module proxy (the OpenAI SDK's) then
        # imports what it stands for, over a thousand modules, at the first activation.
        elif issubclass(type(value), type) and value.__dict__.get("__module__") == name:
            for cattr, cvalue in list(vars(value).items()):
                target = cvalue.__func__ if type(cvalue) is staticmethod else cvalue
                hit = _hit(target)
                if hit is not None:
                    # A plain function would bind as a method where the builtin did not.
                    found.append((value, cattr, cvalue, staticmethod(hit[1])))
    return found


def bindings() -> list[Binding]:
    """Every binding of an original in the loaded modules (rescanned when modules change)."""
    global _flat, _seen
    modules = sys.modules
    key = (len(modules), next(reversed(modules), None))
    if key == _seen:
        return _flat
    for name in [n for n in _scanned if n not in modules]:
        del _scanned[name]
        _found.pop(name, None)
    for name, module in list(modules.items()):
        if _scanned.get(name) is module:
            continue
        _scanned[name] = module
        _found.pop(name, None)
        found = _read(name, module, _scan)
        if found:
            _found[name] = found
    _flat = [binding for found in _found.values() for binding in found]
    _seen = key
    return _flat


def patch_bindings(saved: list[Binding]) -> None:
    """Point every binding at its interceptor; ``saved`` receives what to restore."""
    global _at_activation
    found = bindings()
    _at_activation = _seen
    for namespace, attr, original, replacement in found:
        try:
            if namespace.__dict__.get(attr) is original:
                setattr(namespace, attr, replacement)
                saved.append((namespace, attr, original, replacement))
        except (AttributeError, TypeError):  # a read-only class
            continue


def unpatch_bindings(saved: list[Binding]) -> None:
    while saved:
        namespace, attr, original, replacement = saved.pop()
        if namespace.__dict__.get(attr) is replacement:
            setattr(namespace, attr, original)


def _replaced(value: Any) -> Any:
    """The original of a replacement (a plain one or a staticmethod holding one), else None."""
    hit = _replacements.get(id(value))
    if hit is not None and hit[0] is value:  # one of ours (a not_binding one is a staticmethod)
        return hit[1]
    held = value.__func__ if type(value) is staticmethod else value
    hit = _replacements.get(id(held))
    if hit is None or hit[0] is not held:
        return None
    return staticmethod(hit[1]) if held is not value else hit[1]


def unbind_run() -> None:
    """At the outermost exit: names bound to an interceptor during the run hold the original.

    A module imported inside ``with fs:`` that did ``from sqlite3 import connect`` (or
    ``from os import fsync``, or a class attribute ``_sync = os.fsync``) bound faultfs's
    function; afterwards it holds the real one, as a module imported before the run
    does. Nothing to do (one comparison) when no module was loaded during the run; else
    every loaded module and its classes are looked at, once.
    """
    modules = sys.modules
    if (len(modules), next(reversed(modules), None)) == _at_activation or not _replacements:
        return
    for name, module in list(modules.items()):
        _read(name, module, _unbind)


def _unbind(module: ModuleType) -> None:
    name = module.__name__
    for attr, value in list(vars(module).items()):
        original = _replaced(value)
        if original is not None:
            setattr(module, attr, original)
        elif issubclass(type(value), type) and value.__dict__.get("__module__") == name:
            for cattr, cvalue in list(vars(value).items()):
                original = _replaced(cvalue)
                if original is not None:
                    with contextlib.suppress(AttributeError, TypeError):  # a read-only class
                        setattr(value, cattr, original)


# ------------------------------------------------------------- naming the escape


def _attribute(owner: Any, name: str) -> Any:
    """``owner.name`` as stored (instance dict, then class dicts), without running code."""
    held = getattr(owner, "__dict__", None)
    if isinstance(held, dict) and name in held:
        return held[name]
    for klass in type(owner).__mro__:
        if name in klass.__dict__:
            value = klass.__dict__[name]
            return value.__func__ if isinstance(value, staticmethod) else value
    return None


_LOCAL_LOADS = frozenset({"LOAD_FAST", "LOAD_DEREF", "LOAD_CLASSDEREF", "LOAD_CLOSURE"})
_GLOBAL_LOADS = frozenset({"LOAD_GLOBAL", "LOAD_NAME"})
_ATTRIBUTE_LOADS = frozenset({"LOAD_ATTR", "LOAD_METHOD"})


def _via(frame: FrameType) -> tuple[str, str] | None:
    """(the expression the frame's current line called through, "os.fsync"), if any."""
    local_values = frame.f_locals
    value: Any = None
    expression = ""
    for ins in dis.get_instructions(frame.f_code):
        if ins.positions is None or ins.positions.lineno != frame.f_lineno:
            continue
        name = str(ins.argval)
        if ins.opname in _LOCAL_LOADS:
            value, expression = local_values.get(name), name
        elif ins.opname in _GLOBAL_LOADS:
            value, expression = frame.f_globals.get(name), name
        elif ins.opname in _ATTRIBUTE_LOADS and value is not None:
            value, expression = _attribute(value, name), f"{expression}.{name}"
        else:
            continue
        hit = _hit(value)
        if hit is not None:
            return expression, hit[2]
    return None


def _where(frame: FrameType) -> str:
    module = frame.f_globals.get("__name__", "?")
    return f"{module}:{frame.f_code.co_qualname} ({frame.f_code.co_filename}:{frame.f_lineno})"


_FIX = (
    "faultfs rebinds such names at module and class level of loaded modules, but not in "
    "instances, closures or default arguments. Fix: look the function up when calling it "
    "(os.fsync(fd), not a saved reference), or create the object that saved it after the "
    "FaultFS is active (inside the workload)."
)


def escape_message(frame: FrameType, what: str) -> str:
    via = _via(frame)
    if via is None:
        return (
            f"{_where(frame)}: {what}. The call went around faultfs's interceptors, through a "
            "function faultfs does not intercept (_io.FileIO, for instance) or one bound before "
            "the FaultFS was activated (`from io import FileIO`, for instance: io.FileIO looked "
            f"up at the call is intercepted). Use open(), io.FileIO, os or pathlib. {_FIX}"
        )
    name, original = via
    return (
        f"{_where(frame)} calls {original} through `{name}`, bound before the FaultFS was "
        f"activated, so {what}. {_FIX}"
    )


def _under(path: Any, roots: Sequence[str]) -> bool:
    if not isinstance(path, str | bytes):
        return False
    text = os.path.normpath(os.fsdecode(path))
    return any(text == root or text.startswith(root + "/") for root in roots)


def diagnose(exc: BaseException, roots: Sequence[str] = ()) -> EscapeError | None:
    """An EscapeError when ``exc`` came from a real os call that should have hit a FaultFS.

    Either a simulated descriptor reached the real os (EBADF), or a path under
    one of ``roots`` reached the real file system and failed there (a
    simulated root does not exist on the real disk). Only when the failing
    line called through a name holding an intercepted original; else None.
    """
    if not isinstance(exc, OSError):
        return None
    handoff = numpy_handoff(exc)  # C's fdopen of a simulated descriptor (numpy)
    if handoff is not None:
        return handoff
    unseen = unseen_read(exc, roots)  # a file the model holds, opened from C or Rust
    if unseen is not None:
        return unseen
    if exc.errno == errno.EBADF:
        what = "a simulated descriptor reached the real system (EBADF)"
    elif _under(exc.filename, roots) or _under(exc.filename2, roots):
        what = f"the path {exc.filename!r} reached the real file system ({exc.strerror})"
    else:
        return None
    tb = exc.__traceback__
    if tb is None:
        return None
    while tb.tb_next is not None:
        tb = tb.tb_next
    if _via(tb.tb_frame) is None:
        return None
    return EscapeError(escape_message(tb.tb_frame, what))


# ------------------------------------------------------------------ audit hook

# Audit events of path-taking calls, and which arguments are paths.
_WATCHED: dict[str, tuple[int, ...]] = {
    "open": (0,),
    "os.rename": (0, 1),
    "os.remove": (0,),
    "os.rmdir": (0,),
    "os.mkdir": (0,),
    "os.truncate": (0,),
    "os.link": (0, 1),
    "os.symlink": (1,),
    "os.chmod": (0,),
    "os.chown": (0,),
    "os.utime": (0,),
    "os.listdir": (0,),
    "os.scandir": (0,),
    "os.listxattr": (0,),
    "os.getxattr": (0,),
    "os.setxattr": (0,),
    "os.removexattr": (0,),
}
# Callers allowed to read under a root: the import system, the source readers, and faultfs's
# own look at the real directory (it only reads: the pytest plugin checks it before the
# health checks, while the FaultFS is still active).
_EXEMPT_FILES = ("<frozen importlib", "<frozen zipimport")
_EXEMPT_MODULES = frozenset(
    {"linecache", "tokenize", "importlib._bootstrap_external", "faultfs._realdisk"}
)

_hook_installed = False


def install_audit_hook(stack: Sequence[FaultFS], owner: Callable[[str], FaultFS | None]) -> None:
    """Stop real path calls under an active root (once per process; hooks stay forever).

    Installed when a FaultFS whose root exists on the real disk is activated:
    only there can an escaped call change real files. The hook runs on every
    audited event of the process (each ``sys._getframe`` and ``frame.f_code``
    included), which costs the model's own calls a measurable share.
    """
    global _hook_installed
    if _hook_installed:
        return
    _hook_installed = True

    def audit(event: str, args: tuple[Any, ...]) -> None:
        if not stack:
            return
        spec = _WATCHED.get(event)
        if spec is None:
            return
        for index in spec:
            if index >= len(args):
                continue
            path = args[index]
            if path is None or isinstance(path, int):
                continue
            try:
                text = os.fsdecode(os.fspath(path))
            except TypeError:
                continue
            if not text.startswith("/"):
                text = os.getcwd() + "/" + text
            fs = owner(os.path.normpath(text))
            if fs is None:
                continue
            frame = sys._getframe(1)
            if frame.f_code.co_filename.startswith(_EXEMPT_FILES) or (
                frame.f_globals.get("__name__") in _EXEMPT_MODULES
            ):
                return
            what = f"the real {event} call on {text!r} (under the FaultFS root {fs.root!r})"
            message = escape_message(frame, f"{what} was stopped")
            fs.escapes.append(message)
            raise EscapeError(message)

    sys.addaudithook(audit)


# ------------------------------------------------ C extensions faultfs cannot see

LIMITS = (
    "faultfs can neither see nor crash that I/O, and its files do not exist in the model "
    "(docs/faultfs.md, 'Limits: what faultfs cannot see'). Test this part of the program "
    "on a real kernel (a killed child process; LazyFS for power loss: docs/lazyfs.md), or "
    "keep it out of the FaultFS root and the workload."
)


def record_blind(fs: FaultFS, message: str) -> EscapeError:
    fs.escapes.append(message)  # recorded: explore and the fixtures fail even if swallowed
    return EscapeError(message)


def refuse_c_store(
    owner: Callable[[str], FaultFS | None], path: str | None, call: str, what: str, who: str
) -> None:
    """EscapeError (recorded) when C code is about to open ``path`` under an active root."""
    fs = owner(path) if path is not None else None
    if fs is not None:
        raise record_blind(
            fs,
            f"{call} opens {what} under the FaultFS root {fs.root!r}: {who} reads and writes "
            f"it from C, not through Python's os and io, so {LIMITS}",
        )


def blind_spots(
    owner: Callable[[str], FaultFS | None], fd_path: Callable[[int], tuple[FaultFS, str] | None]
) -> list[tuple[Any, str, Any]]:
    """(namespace, name, replacement) naming sqlite3 and mmap on a simulated file.

    Without them they fail with their own bare error ("unable to open
    database file" under a simulated root, EBADF for a simulated descriptor),
    or under a real root work unseen on the real disk. Patched like the os
    functions, only while a FaultFS is active, in modules loaded at activation
    or as they finish loading during the run (faultfs._late_imports; an audit
    hook would cost every audited event of the process, each simulated
    operation's included).
    """
    new: list[Any] = []
    sqlite = sys.modules.get("sqlite3")
    real_connect = getattr(sqlite, "connect", None)
    if real_connect is not None and not hasattr(real_connect, "__wrapped__"):

        def checked_connect() -> Any:
            def connect(database: Any, *args: Any, **kwargs: Any) -> Any:
                path = _database_path(database)
                refuse_c_store(owner, path, f"sqlite3.connect({path!r})", "a database", "sqlite3")
                return real_connect(database, *args, **kwargs)

            connect.__wrapped__ = real_connect  # type: ignore[attr-defined]
            return connect

        if wrapper(real_connect, checked_connect, "sqlite3.connect")[1]:
            new.append(real_connect)
    mmap_module = sys.modules.get("mmap")
    real_mmap: Any = getattr(mmap_module, "mmap", None)
    if real_mmap is not None and real_mmap.__module__ == "mmap":

        def checked_mmap() -> Any:
            class CheckedMmap(real_mmap):
                """mmap.mmap while faultfs is active: a simulated descriptor is named."""

                def __new__(cls, fileno: int, *args: Any, **kwargs: Any) -> Any:
                    found = fd_path(fileno) if isinstance(fileno, int) else None
                    if found is not None:
                        fs, path = found
                        raise record_blind(
                            fs,
                            f"mmap.mmap of {path!r} (under the FaultFS root {fs.root!r}): loads "
                            "and stores in a mapping, and its flush, are not calls Python makes "
                            f"through os and io, so {LIMITS}",
                        )
                    return real_mmap(fileno, *args, **kwargs)  # a plain mmap, not this class

            CheckedMmap.__module__ = "faultfs"
            return CheckedMmap

        if wrapper(real_mmap, checked_mmap, "mmap.mmap")[1]:
            new.append(real_mmap)
    # Every module and class name holding a newly wrapped original (sqlite3.connect and
    # sqlite3.dbapi2.connect included); once wrapped, patch_bindings finds them at activation.
    return bound_to(new)


def _database_path(database: Any) -> str | None:
    """The absolute path sqlite3 would open, or None (":memory:", a descriptor, junk)."""
    if database is None or isinstance(database, int) or database == ":memory:":
        return None
    try:
        text = os.fsdecode(os.fspath(database))
    except TypeError:
        return None
    if text.startswith("file:"):  # a URI: its path is what follows, up to the query
        text = text[5:].split("?", 1)[0]
    if not text.startswith("/"):
        text = os.getcwd() + "/" + text
    return os.path.normpath(text)


# ------------------------------------------------------------ a crashed run's objects


@contextlib.contextmanager
def dead_finalizers() -> Iterator[None]:
    """Swallow what finalizers raise for the dead process (SimulatedCrash), report the rest."""
    previous = sys.unraisablehook

    def quiet(unraisable: Any) -> None:
        if not isinstance(unraisable.exc_value, SimulatedCrash):
            previous(unraisable)

    sys.unraisablehook = quiet
    try:
        yield
    finally:
        sys.unraisablehook = previous


def bury(tb: TracebackType | None) -> None:
    """Clear the frames of ``tb`` and collect garbage, dropping the dead process's I/O errors.

    Called while the crashed FaultFS is still active: finalizers of the run's
    objects then meet the dead process (IOAfterCrash, not printed) instead of
    the real file system.
    """
    if tb is not None:
        traceback.clear_frames(tb)
    with dead_finalizers():
        gc.collect()
