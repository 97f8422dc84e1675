"""What a substrat root is, and the only place that makes or adopts one.

Substrat never changes the mode or the contents of a directory it did not
create. A directory is a root when it holds the marker file
``substrat-root.json`` (written durably when the root is made, with the
format version), or when it is a root left by a version from before the
marker (a *legacy* root, see :func:`inspect`). Anything else that exists is
not a root:

* missing, or an empty directory: no root yet. Only the commands that create
  (``daemon start``/``restart``, ``agent create``, the daemon process itself)
  make one there; an empty directory is adopted only if it is already private
  (no group or other permission bits) and ours, and it is never chmodded;
* not empty and not a root (a home directory, ``/tmp``, a project): refused,
  with the entries that make it so, before anything is written;
* not a directory, unreadable, not writable (read-only file system, an
  immutable directory, no write permission), owned by another user: unusable,
  refused with one line saying what to do.

:func:`require_root` is for commands that only read (they never create a
root); :func:`prepare_root` is for everything that writes (it creates, adopts
or upgrades, and checks that the root can be written). Both raise
:class:`~substrat.errors.RootError` subclasses, which every command turns into
exit status 2.
"""

from __future__ import annotations

import enum
import errno
import functools
import os
import stat
from pathlib import Path
from typing import NamedTuple

from substrat import __version__, paths, persistence, rootmarker
from substrat.errors import NestedRootError, NotARootError, RootPermissionError, RootUnusableError
from substrat.rootmarker import MARKER_FORMAT as MARKER_FORMAT
from substrat.rootmarker import MARKER_VERSION as MARKER_VERSION
from substrat.rootnest import MARKER_NAME as MARKER_NAME
from substrat.rootnest import dangling, enclosing_root, kernel_place, root_within, settled
from substrat.rootnest import user_name as user_name
from substrat.rpc import lock
from substrat.rpc.transport import SOCKET_NAME
from substrat.shellword import shell_word, shown

MAX_ROOT_PATH_CHARS = lock.MAX_SOCKET_FIELD_CHARS - len(os.sep + SOCKET_NAME)
"""The longest root path, as the lock file records it (``lock.record_chars``: a non-ASCII
character counts as its JSON escape): the running daemon's record names its socket
(``<root>/daemon.sock``) in at most ``lock.MAX_LOCK_BYTES``. A longer path is refused before
anything is created (an older version made the root, then failed writing the record)."""
DAEMON_LOG_NAME = "daemon.log"
_LISTED_MAX = 5


@functools.cache
def legacy_names() -> frozenset[str]:
    """What a root made before the marker may hold at its top level (``LEGACY_NAMES``).

    The storage modules own them, imported on first use: every command checks its root
    here, and a marked root never needs them (their import was a quarter of a command's
    start-up). Kept once built: an unmarked root's open asks once per top-level name.
    """
    from substrat.checkpoints import CHECKPOINTS_DIR
    from substrat.incidents import INCIDENTS_DIR
    from substrat.logs import USER_DIR
    from substrat.registry import REGISTRY_DIR
    from substrat.session.store import AGENTS_DIR, QUARANTINE_DIR, TERMINATED_DIR

    return frozenset(
        {
            AGENTS_DIR,
            USER_DIR,
            QUARANTINE_DIR,
            TERMINATED_DIR,
            REGISTRY_DIR,
            CHECKPOINTS_DIR,
            INCIDENTS_DIR,
            lock.LOCK_NAME,
            SOCKET_NAME,
            DAEMON_LOG_NAME,
        }
    )


def __getattr__(name: str) -> frozenset[str]:
    if name == "LEGACY_NAMES":  # the constant it was; importing it loads the names
        return legacy_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class RootState(enum.Enum):
    MISSING = "missing"
    EMPTY = "empty"
    ROOT = "root"
    LEGACY = "legacy"
    FOREIGN = "foreign"


# A NamedTuple, not a frozen dataclass: every CLI process and daemon defines it (see LockInfo)
class RootInfo(NamedTuple):
    """What is at a root path (see :func:`inspect`)."""

    path: Path
    state: RootState
    version: int | None = None
    """The marker's format version (ROOT only; None if the marker is unreadable)."""
    strangers: tuple[str, ...] = ()
    """FOREIGN only: the entries that make the directory not a root."""
    unproven: bool = False
    """LEGACY only: substrat's hand shows only as an empty ``agents/``, which a project's
    directory may hold too: adopted as an empty directory is (if already private, never
    chmodded)."""

    @property
    def is_root(self) -> bool:
        return self.state in (RootState.ROOT, RootState.LEGACY)


def _unusable(path: Path, exc: OSError, doing: str) -> RootUnusableError | RootPermissionError:
    if (place := kernel_place(path)) is not None:  # a realpath: only once something failed
        return RootUnusableError(f"cannot use {path} as a substrat root: {place}")
    if exc.errno == errno.EACCES:
        try:
            info = os.stat(path)
        except OSError:
            info = None
        if info is not None and stat.S_ISDIR(info.st_mode) and info.st_uid != os.getuid():
            # another user's private root (0700, as every root is): say whose, as for
            # one that can be listed, not only "permission denied"
            return _foreign(path, info.st_uid, is_root=False)
        if info is not None and info.st_uid == os.getuid() and stat.S_ISDIR(info.st_mode):
            mode = stat.S_IMODE(info.st_mode)
            return RootUnusableError(
                f"cannot use {path} as a substrat root: {doing} failed: its mode {mode:04o} "
                f"does not let you read and write it; `chmod 700 {shell_word(path)}` fixes that"
            )
    if exc.errno == errno.EEXIST and (link := dangling(path)) is not None:
        return link
    reason = {
        errno.EROFS: "it is on a read-only file system",
        errno.EACCES: "permission denied",
        errno.EPERM: "the operation is not permitted (an immutable directory?)",
        errno.ENOTDIR: "a component of the path is not a directory",
        errno.ENOSPC: "no space left on the device",
        errno.EDQUOT: "the disk quota is exceeded",
        errno.ELOOP: "its symlinks point at each other in a loop (see `ls -l` of them)",
        errno.ENAMETOOLONG: "a name in it is longer than its file system allows (255 bytes?)",
    }.get(exc.errno or 0, exc.strerror or str(exc))
    if exc.errno == errno.ENAMETOOLONG and len(os.fsencode(path)) >= os.pathconf(
        "/", "PC_PATH_MAX"
    ):
        reason = "the path is longer than the system allows (PATH_MAX)"
    fix = "use --root or SUBSTRAT_HOME to pick a directory you can write"
    if exc.errno in (errno.ELOOP, errno.ENAMETOOLONG):  # a mistyped path, not the host's doing
        other = "shorter path" if exc.errno == errno.ENAMETOOLONG else "path without the loop"
        fix = f"use --root or SUBSTRAT_HOME to give a {other}"
    if exc.errno == errno.EROFS and os.path.isdir(path) and not os.listdir(path):
        fix = f"remount its file system read-write, or {fix}"  # empty: nothing to read there
    elif exc.errno == errno.EROFS and os.path.isdir(path):
        # a root already there (a new one can go elsewhere): its data is on this mount
        fix = (
            "remount its file system read-write (`substrat recover --dry-run --root "
            f"{shell_word(path)}` and `substrat fsck --root {shell_word(path)}` read it as it is)"
        )
    elif exc.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = f"free space on its file system (or {fix})"
    return RootUnusableError(
        f"cannot use {path} as a substrat root: {doing} failed: {reason}; {fix}"
    )


def inspect(root: str | os.PathLike[str]) -> RootInfo:
    """Classify ``root`` without writing anything.

    A legacy root (made by a version without the marker) holds nothing at its
    top level but substrat's own names (``agents/``, ``user/``,
    ``quarantine/``, ``daemon.lock``, ``daemon.sock``, ``daemon.log``, and
    ``*.tmp`` leftovers of those), and shows substrat's hand: a
    ``daemon.lock`` with a daemon's record in it, or an ``agents/`` directory
    holding session directories (or nothing). Raises RootUnusableError
    when the path is not a directory or cannot be read.
    """
    looked = _look(root)
    if isinstance(looked, RootInfo):
        return looked
    path, names, strangers = looked
    evidence = _substrat_evidence(path, names) if not strangers else None
    if evidence is not None:
        return RootInfo(path, RootState.LEGACY, unproven=evidence == _EMPTY_AGENTS)
    return RootInfo(path, RootState.FOREIGN, strangers=strangers or tuple(names))


def _look(root: str | os.PathLike[str]) -> RootInfo | tuple[Path, list[str], tuple[str, ...]]:
    """What the top level of ``root`` decides (missing, a root, empty: its RootInfo),
    else its path, its sorted names and those substrat would not have put there."""
    # the Path kept for this root (an open inspects it first, every time)
    path = settled(paths.under(root).expanduser().absolute())  # `..` as the kernel takes it
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return RootInfo(path, RootState.MISSING)
    except OSError as exc:
        raise _unusable(path, exc, "looking it up") from None
    if not stat.S_ISDIR(info.st_mode):
        raise RootUnusableError(
            f"cannot use {path} as a substrat root: it is not a directory; "
            "point --root or SUBSTRAT_HOME at a directory"
        )
    try:
        names = sorted(os.listdir(path))
    except OSError as exc:
        raise _unusable(path, exc, "listing it") from None
    if MARKER_NAME in names:
        return RootInfo(path, RootState.ROOT, version=rootmarker.version_of(rootmarker.read(path)))
    if not [n for n in names if n != MARKER_NAME + persistence.TMP_SUFFIX]:
        return RootInfo(path, RootState.EMPTY)  # a crash may leave the marker's temp file
    return path, names, tuple(n for n in names if _base_name(n) not in legacy_names())


def _base_name(name: str) -> str:
    return name.removesuffix(persistence.TMP_SUFFIX)


_EMPTY_AGENTS = "an empty agents/"


def _substrat_evidence(path: Path, names: list[str]) -> str | None:
    """What shows substrat made ``path`` (None: nothing does)."""
    if lock.LOCK_NAME in names:
        try:
            info = lock.read_info(path)
        except OSError:
            info = None
        if info is not None and info.state in ("running", "stopped"):
            return "a daemon's lock"
    from substrat.session.store import AGENTS_DIR

    if AGENTS_DIR not in names:
        return None
    try:  # not a directory (or none): listing it fails, as is_dir() would have said
        sessions = os.listdir(path / AGENTS_DIR)
    except OSError:
        return None
    if not sessions:
        return _EMPTY_AGENTS
    # One session directory is evidence enough (fsck reports the odd names
    # beside it); a project's own agents/ directory holds none.
    # A root made inside one (with a session id's name) is not a session: the directory
    # holding it is not taken for a root from before the marker (a root made above another).
    found = any(
        _is_session_id(n) and not os.path.lexists(path / AGENTS_DIR / n / MARKER_NAME)
        for n in sessions
    )
    return "a session directory" if found else None


def _is_session_id(name: str) -> bool:
    from substrat.session.model import validate_session_id

    try:
        validate_session_id(name)
    except ValueError:
        return False
    return True


def _no_root_message(info: RootInfo) -> str:
    path = info.path
    if (outer := enclosing_root(path)) is not None:  # not "`daemon start` creates one" there
        return (
            f"no substrat root at {path}: it is {_inside(path, outer)}; use `--root "
            f"{shell_word(outer)}` for that root, or pick a path outside it for a new one"
        )
    if info.state is RootState.FOREIGN:
        listed = ", ".join(map(shown, info.strangers[:_LISTED_MAX]))
        more = f" and {len(info.strangers) - _LISTED_MAX} more" if len(info.strangers) > 5 else ""
        return (
            f"{path} is not a substrat root and not empty (it holds {listed}{more}, and no "
            f"{MARKER_NAME}); substrat never writes into a directory it did not create: point "
            "--root or SUBSTRAT_HOME at a new or empty directory"
        )
    if info.state is RootState.MISSING and (place := kernel_place(path)) is not None:
        return f"cannot use {path} as a substrat root: {place}"  # not "... creates one"
    if info.state is RootState.MISSING and (link := dangling(path)) is not None:
        return str(link)  # not "`daemon start` creates one": it would refuse
    what = "nothing is there" if info.state is RootState.MISSING else "an empty directory"
    first = ""
    if info.state is RootState.EMPTY:
        # The creating commands would refuse it next (prepare_root): say so now.
        try:
            mode = stat.S_IMODE(os.stat(path).st_mode)
        except OSError:
            mode = 0
        if mode and persistence.on_read_only_fs(path):  # no chmod, no root can be made
            return (
                f"no substrat root at {path} (an empty directory on a read-only file system); "
                "remount it read-write, or pick a writable directory with --root or SUBSTRAT_HOME"
            )
        if mode & 0o077:
            what = f"an empty directory readable by others, mode {mode:04o}"
            first = f"`chmod 700 {shell_word(path)}`, then "
    return (
        f"no substrat root at {path} ({what}); {first}`substrat daemon start --root "
        f"{shell_word(path)}` or `substrat agent create NAME --root {shell_word(path)}` creates one"
    )


def _check_new(info: RootInfo) -> None:
    """Refuse, writing nothing, to make a root inside another one."""
    if not (info.state in (RootState.MISSING, RootState.EMPTY) or info.unproven):
        return
    outer = enclosing_root(info.path)
    if outer is None:
        return
    raise NestedRootError(
        f"cannot make a substrat root at {info.path}: it is {_inside(info.path, outer)}, whose "
        "fsck would take it for damage and move it, or whose daemon would write into it; pick "
        f"a path outside {shown(outer)}"
    )


def _inside(path: Path, outer: Path) -> str:
    under = Path(os.path.realpath(path)).relative_to(outer).parts[0]
    return f"inside the substrat root {shown(outer)} (under its {under}/)"


def _check_length(info: RootInfo) -> None:
    chars = lock.record_chars(info.path)
    if chars <= MAX_ROOT_PATH_CHARS:
        return
    fix = "use a shorter --root"
    if info.is_root:  # a root an older version half-made (or a moved one)
        fix = "move the directory to a shorter path (`mv`; nothing in it is lost)"
    raise RootUnusableError(
        f"cannot use {info.path} as a substrat root: its path is {chars} characters long (as "
        f"the lock file records it), over the limit of {MAX_ROOT_PATH_CHARS} (the daemon's "
        f"lock record holds it in {lock.MAX_LOCK_BYTES} bytes); {fix}"
    )


def require_root(root: str | os.PathLike[str]) -> RootInfo:
    """The root at ``root``, for a command that only reads: nothing is created or written.

    Raises NotARootError when there is no root there (missing, empty, or a
    directory that is not a root) and RootUnusableError when the path cannot
    be read.
    """
    info = inspect(root)
    if not info.is_root:
        raise NotARootError(_no_root_message(info))
    owner = os.stat(info.path).st_uid
    if owner != os.getuid():
        # its files are private to that user, and its daemon answers no other
        raise _foreign(info.path, owner)
    _check_version(info)
    _check_length(info)
    return info


def foreign_daemon(socket: Path) -> RootPermissionError | None:
    """Why a daemon hung up at once, if its peer-uid check refused us: its socket is
    another user's (the refusal line it sends may be lost to the hang-up)."""
    try:
        owner = os.stat(socket).st_uid
    except OSError:
        return None
    if owner == os.getuid():
        return None
    return RootPermissionError(
        f"the daemon at {socket} runs as uid {owner}{user_name(owner)} and refuses other "
        f"users (you are uid {os.getuid()}); it read no request: run the command as uid "
        f"{owner}, or use a root of your own (--root or SUBSTRAT_HOME)"
    )


def _foreign(path: Path, owner: int, *, is_root: bool = True) -> RootPermissionError:
    """Another user's root (or directory): its daemon refuses every other user."""
    name = user_name(owner)
    if not is_root:
        return RootPermissionError(
            f"{path} belongs to uid {owner}{name}, not to you (uid {os.getuid()}); "
            "use a root of your own (--root or SUBSTRAT_HOME)"
        )
    return RootPermissionError(
        f"root {path} belongs to uid {owner}{name}, not to you (uid {os.getuid()}): only "
        "that user can use it (its daemon runs as that user and refuses others); run the "
        f"command as uid {owner}, or use a root of your own (--root or SUBSTRAT_HOME)"
    )


def refuse_foreign(root: str | os.PathLike[str]) -> RootInfo:
    """Fail early, writing nothing, if a creating command could not use ``root``."""
    info = inspect(root)
    if info.state is RootState.FOREIGN:
        raise NotARootError(_no_root_message(info))
    _check_version(info)
    _check_length(info)
    _check_new(info)
    return info


def refuse_strangers(root: str | os.PathLike[str]) -> None:
    """Fail, writing nothing, if ``root`` holds anything substrat would not have put there.

    For :meth:`substrat.orchestrator.Orchestrator.open`, which has always made
    its root without the marker: a directory holding only substrat's own
    names is accepted even when :func:`inspect` cannot tell it is a root (a
    crash can leave ``user/`` made and ``agents/`` not yet), but a mistyped
    path to a project or a home directory is refused before anything is
    created in it.
    """
    looked = _look(root)
    if isinstance(looked, RootInfo):
        _check_version(looked)
    elif looked[2]:
        raise NotARootError(
            _no_root_message(RootInfo(looked[0], RootState.FOREIGN, strangers=looked[2]))
        )
    # Only substrat's names: accepted, legacy root or not, so agents/ is not listed.


def _check_version(info: RootInfo) -> None:
    if info.version is not None and info.version > MARKER_VERSION:
        raise RootUnusableError(
            f"{info.path} is a substrat root of format {info.version}, newer than this "
            f"substrat {__version__} reads (format {MARKER_VERSION}); upgrade substrat"
        )


def prepare_root(root: str | os.PathLike[str], *, create: bool = True) -> Path:
    """Make ``root`` ready for writing and return its absolute path.

    Creates it when missing (mode 0700, durably) if ``create``; adopts an empty
    directory that is ours and already private (never chmods it); writes the
    marker into a new, adopted or legacy root (an atomic write, fsynced, with
    its directory); tightens a root of ours with looser permissions to 0700
    (the socket inside must not be reachable by others). Refuses, writing
    nothing: a directory that is not a root, one owned by another user, an
    empty one with group or other permissions, one that cannot be written.
    """
    info = inspect(root)
    path = info.path
    if info.state is RootState.FOREIGN or (not create and not info.is_root):
        raise NotARootError(_no_root_message(info))
    _check_version(info)
    _check_length(info)
    _check_new(info)
    if info.state is RootState.MISSING:
        try:
            persistence.durable_mkdir(path)
        except OSError as exc:
            raise _unusable(path, exc, "creating it") from None
    mode = _check_owner_and_access(path, is_root=info.is_root)
    if (info.state is RootState.EMPTY or info.unproven) and mode & 0o077:
        what = "is empty" if info.state is RootState.EMPTY else "holds only an empty agents/"
        raise RootPermissionError(
            f"{path} {what} but is readable by others (mode {mode:04o}); substrat does not "
            f"change the mode of a directory it did not create: run `chmod 700 {shell_word(path)}` "
            "to make it private, or pick another directory"
        )
    if info.state is not RootState.ROOT or info.version is None:
        # an older format is raised by the process that then holds the root
        # (rootmarker.upgrade): this one may yet be refused it, by a daemon serving it
        _write_marker(path)
    if info.state in (RootState.ROOT, RootState.LEGACY) and mode & 0o077:
        try:
            # Our own root, loosened since: the socket inside must stay private.
            os.chmod(path, mode & ~0o077)
        except OSError as exc:
            raise _unusable(path, exc, "making it private (chmod 700)") from None
    return path


def check_serving(root: Path) -> None:
    """Refuse, with one line saying what to do (RootUnusableError), a root whose daemon
    could not start: its user's inbox (:func:`check_user_log`) or its ``agents/``
    cannot be used. One agent's files cost that agent (it is held back); ``agents/``
    holds every agent, and recovery must list it."""
    check_user_log(root)
    agents = root / "agents"
    if os.path.isdir(agents) and not os.access(agents, os.R_OK | os.W_OK | os.X_OK):
        uid = os.geteuid()
        raise RootUnusableError(
            f"cannot serve {root}: {agents} cannot be read and written (permission denied); "
            f"give uid {uid} access (`chown -R {uid} {shell_word(agents)} && chmod -R u+rwX "
            f"{shell_word(agents)}`), then start the daemon again"
        )


def check_user_log(root: Path) -> None:
    """Refuse to serve a root whose user's inbox (``user/events.jsonl``) cannot be used:
    RootUnusableError with what to do. Unlike one agent's files, which cost that agent
    (it is held back), the inbox is every agent's: any turn may message the user, and a
    message the daemon cannot log it must not acknowledge (docs/daemon.md)."""
    path = root / "user" / "events.jsonl"
    if not os.path.lexists(path) and not os.path.lexists(path.parent):
        return  # a new root: the first message creates it
    check_inbox_not_a_root(root)
    why = None
    if os.path.lexists(path.parent) and not path.parent.is_dir():
        why = f"{path.parent} is not a directory"
    elif os.path.lexists(path) and not path.is_file():
        why = f"{path} is not a file"
    if why is not None:
        raise RootUnusableError(
            f"cannot serve {root}: the user's inbox cannot be used ({why}); "
            f"`substrat fsck --repair --root {shell_word(root)}` moves it to quarantine/ (the "
            "messages the agents sent you come back from their logs), then start the daemon again"
        )
    for target, mode in ((path.parent, os.W_OK | os.X_OK), (path, os.R_OK | os.W_OK)):
        if os.path.exists(target) and not os.access(target, mode):
            uid = os.geteuid()
            raise RootUnusableError(
                f"cannot serve {root}: the user's inbox {path} cannot be read and written "
                f"(permission denied); give uid {uid} access (`chown -R {uid} "
                f"{shell_word(path.parent)} && chmod -R u+rwX {shell_word(path.parent)}`), then "
                "start the daemon again"
            )


def check_inbox_not_a_root(root: Path, doing: str = "serve") -> None:
    """Refuse (RootUnusableError, with how to move it out) a root whose ``user/`` is a
    substrat root of its own, made there by an older version: this root's inbox would be
    written into it (its segments sealed and archived there), a live root's directory."""
    where = root / "user"
    nested = root_within(where)
    if nested is not None:
        raise RootUnusableError(
            f"cannot {doing} {root}: its user/ is a substrat root of its own ({nested}), made "
            "there by an older version; this root's inbox would be written into it. Move it "
            f"out by hand: `substrat daemon stop --root {shell_word(where)}`, `mv "
            f"{shell_word(where)} DEST`, then move this root's inbox files back (`mkdir -m 700 "
            f"{shell_word(where)}` and `mv DEST/events.* {shell_word(where)}/`, if there are "
            "any), then run this again"
        )


_HOST_ERRNOS = frozenset(
    {errno.EACCES, errno.EPERM, errno.EROFS, errno.EIO, errno.ENOSPC, errno.EDQUOT, errno.EFBIG,
     errno.EMFILE, errno.ENFILE, errno.ENOTDIR, errno.EISDIR}
)  # fmt: skip
"""What the host does to a root (modes, mounts, disks, limits), not a fault of the code."""


def user_log_failure(root: Path, exc: OSError) -> str | None:
    """What to say of ``exc`` if it came from the user's inbox (``user/``: an EIO that
    :func:`check_user_log` could not foresee), or from another of the root's own files
    (``agents/`` at mode 000), in one line with what to do; else None (a traceback)."""
    from substrat import access  # here, on a failure: a CLI process loads it no more

    where = os.fspath(exc.filename) if exc.filename is not None else ""
    inbox = root / "user"
    if where.startswith(f"{inbox}{os.sep}"):
        item = access.unreadable("user", where, exc, then="start the daemon again")
        return f"cannot serve {root}: the user's inbox failed: {item.error}; {item.what_to_do}"
    if exc.errno not in _HOST_ERRNOS or not where.startswith(f"{root}{os.sep}"):
        return None
    # Not one agent's file (that agent would have been held back): the root's own.
    item = access.unreadable("", where, exc, then="start the daemon again")
    return f"cannot serve {root}: {where} failed: {item.error}; {item.what_to_do}"


def _check_owner_and_access(path: Path, *, is_root: bool) -> int:
    info = os.stat(path)
    if info.st_uid != os.getuid():
        raise _foreign(path, info.st_uid, is_root=is_root)
    if not os.access(path, os.R_OK | os.W_OK | os.X_OK):
        # access() also says no for a read-only mount (EROFS) and an immutable
        # directory (EPERM); tell the first apart, without writing anything.
        if persistence.on_read_only_fs(path):
            raise _unusable(path, OSError(errno.EROFS, "read-only"), "writing to it")
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o700 != 0o700:
            raise RootUnusableError(
                f"cannot use {path} as a substrat root: its mode {mode:04o} does not let you "
                f"read and write it; `chmod 700 {shell_word(path)}` fixes that"
            )
        raise RootUnusableError(
            f"cannot use {path} as a substrat root: it cannot be written although its mode "
            f"is {mode:04o}; is it immutable (`lsattr -d {path}`, `chattr -i` clears that)?"
        )
    return stat.S_IMODE(info.st_mode)


def _write_marker(path: Path) -> None:
    try:
        rootmarker.write(path)
    except OSError as exc:
        cause = exc.__cause__ if isinstance(exc.__cause__, OSError) else exc
        raise _unusable(path, cause, f"writing {MARKER_NAME}") from None
