"""fsck of the root's own logs: the user's inbox, the root registry, the checkpoint store,
the incident log.

Each is one file every agent shares, so what the daemon does when one cannot be
used differs (docs/daemon.md): without the user's inbox it refuses to start
(one line saying what to fix, :func:`substrat.rootdir.check_user_log`); without
the registry it serves but creates no root; without the checkpoint store it
serves but checkpoints nothing (every start reads every log in full, and no
segment is ever compacted). fsck reports each with what to do: a file it cannot
read or write (EACCES, EIO, a read-only file) as the access advice says, and a
directory or other non-file where the file belongs as ``bad_*``, which
``--repair`` moves to ``quarantine/`` (recovery then starts a new one).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

from substrat import access, persistence
from substrat.checkpoints import store_path
from substrat.eventlog import LOG_NAME
from substrat.incidents import incidents_path, read_incidents
from substrat.logs import USER_DIR
from substrat.registry import registry_path
from substrat.rootnest import MARKER_NAME, NESTED_ROOT_ADVICE, root_within
from substrat.session.store import AGENTS_DIR, QUARANTINE_DIR

Add = Callable[..., None]
"""``report.add(kind, path, severity, detail, *, count=1, repair=None)`` of substrat.fsck."""
DAMAGE = "damage"
THEN = "run `substrat fsck` again"
QUARANTINED = "move it to quarantine/"


def _writable(path: Path) -> None:
    """Raise what writing ``path`` (and its directory, for atomic rewrites) would meet."""
    if not path.parent.is_dir():
        return  # not there yet: the daemon creates it (a root from before it, say)
    if persistence.on_read_only_fs(path.parent):
        return  # fsck on a read-only mount reports that once (read_only_root)
    for target, mode in ((path.parent, os.W_OK | os.X_OK), (path, os.R_OK | os.W_OK)):
        if os.path.exists(target) and not os.access(target, mode):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(target))


def _not_a_file(path: Path) -> bool:
    return (os.path.lexists(path.parent) and not path.parent.is_dir()) or (
        os.path.lexists(path) and not path.is_file()
    )


def _inspect_shared_log(
    add: Add,
    inspect_log: Callable[[Path], None],
    path: Path,
    bad: tuple[str, Path, str, str | None],
    unreadable: tuple[str, str],
) -> None:
    """One root log: ``bad`` (kind, where, detail, repair) when it is not a file, else
    read and checked writable: ``unreadable`` (kind, what it costs) with the advice."""
    if _not_a_file(path):
        kind, where, detail, repair = bad
        add(kind, where, DAMAGE, detail, repair=repair)
        return
    try:
        inspect_log(path)
        _writable(path)
    except OSError as exc:
        item = access.unreadable(path.parent.name, path, exc, then=THEN)
        kind, costs = unreadable
        add(kind, path, DAMAGE, f"{item.error}: {costs}; {item.what_to_do}")


def inspect_user_log(root: Path, add: Add, inspect_log: Callable[[Path], None]) -> None:
    """``user/events.jsonl``: read like an agent's log, and checked writable."""
    path = root / USER_DIR / LOG_NAME
    if not os.path.lexists(path.parent):
        return
    bad = (
        "bad_user_log",
        path,
        "the user's inbox is not a file (a directory or another thing is where the log "
        "belongs); the daemon cannot start",
        f"{QUARANTINED}; recovery starts a new one, delivering again the messages the "
        "agents' logs say they sent you",
    )
    costs = "the daemon cannot start without the user's inbox"
    _inspect_shared_log(add, inspect_log, path, bad, ("unreadable_user_log", costs))


def inspect_registry(root: Path, add: Add, inspect_log: Callable[[Path], None]) -> None:
    """``roots/events.jsonl``: read, and checked writable (the daemon registers roots)."""
    path = registry_path(root)
    bad = (
        "bad_registry",
        path.parent,
        "the root registry is not a directory holding a file; no root can be created",
        f"{QUARANTINED}, rebuild it from the logs (recovery)",
    )
    costs = "no root can be created"
    _inspect_shared_log(add, inspect_log, path, bad, ("unreadable_registry", costs))


def inspect_checkpoint_store(root: Path, add: Add) -> None:
    """``checkpoints/events.jsonl``: a file the daemon can write (read by fsck_checkpoints)."""
    path = store_path(root)
    if _not_a_file(path):
        add(
            "bad_checkpoints",
            path,
            DAMAGE,
            "the checkpoint store is not a file: the daemon writes no checkpoint (every "
            "start reads every log in full, no segment is compacted)",
            repair=f"{QUARANTINED}; the recovery that ends the repair writes a new one",
        )
        return
    try:
        _writable(path)
    except OSError as exc:
        item = access.unreadable("checkpoints", path, exc, then=THEN)
        add(
            "unwritable_checkpoints",
            path,
            DAMAGE,
            f"{item.error}: the daemon writes no checkpoint (every start reads every log "
            f"in full, no segment is compacted); {item.what_to_do}",
        )


def inspect_nested_roots(root: Path, add: Add, sessions: list[str]) -> None:
    """Report each substrat root made inside this one (``nested_root``: damage, never
    repaired): a directory at the top level (``user/``, ``quarantine/`` or any other),
    in ``quarantine/`` (moved there by an older fsck), or a session's directory under
    ``agents/`` holding the marker (a name that is not a session's is reported from the
    scan). fsck --repair and the start leave each where it is: its daemon may run in it."""
    names = sorted(os.listdir(root))
    found = [(root / n, root_within(root / n)) for n in names if n != AGENTS_DIR]
    quarantine = root / QUARANTINE_DIR
    if quarantine.is_dir() and not root_within(quarantine):
        found += [(quarantine / n, root_within(quarantine / n)) for n in os.listdir(quarantine)]
    agents = root / AGENTS_DIR
    found.append((agents, root_within(agents)))
    found += [
        (agents / sid, f"it holds {MARKER_NAME}")
        for sid in sessions
        if os.path.lexists(agents / sid / MARKER_NAME)
    ]
    for path, why in found:
        if why is None:
            continue
        detail = f"a substrat root inside this one: {why}; {NESTED_ROOT_ADVICE}"
        if path == root / USER_DIR:
            detail += f" (then put this root's inbox, its {LOG_NAME}, back in a new {USER_DIR}/)"
        add("nested_root", path, DAMAGE, detail)


def inspect_incidents(root: Path, add: Add, inspect_log: Callable[[Path], None]) -> None:
    """``incidents/events.jsonl`` (:mod:`substrat.incidents`): read like any log (a damaged
    record is reported, and ``--repair`` moves it to quarantine/), checked writable, and
    each open incident reported as damage, which only ``--acknowledge ID`` clears."""
    path = incidents_path(root)
    if not os.path.lexists(path.parent):
        return
    bad = (
        "bad_incidents",
        path,
        "the incident log is not a file: recovery can neither read nor record an incident, "
        "so the daemon cannot start; look at it, then move it out of the root",
        None,
    )
    costs = "recovery reads it at every start: the daemon cannot start"
    _inspect_shared_log(add, inspect_log, path, bad, ("unreadable_incidents", costs))
    try:
        read = read_incidents(root)
    except OSError:
        return  # reported just above
    for incident in read.open():
        add("incident_open", incident.data.get("log") or path, DAMAGE, incident.message())
