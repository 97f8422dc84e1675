"""Which substrat code a process runs: every release says version 0.1.0, so the version
cannot tell a daemon started before an upgrade from one of the new code.

:data:`CODE` is the package's directory and a digest of its modules' names, sizes and
modification times, taken when this module is first imported (the daemon imports it at
start, so it describes the code the daemon loaded, even if the files are replaced while
it runs). ``daemon start`` compares the running daemon's (``daemon.status``'s ``code``)
with its own: a daemon of an older installation (which reports none) or of files changed
since is named, with ``daemon restart`` as the way to run this one. An identical
reinstall counts as changed (new modification times): the advice then costs a restart,
never a daemon left on old code unsaid.
"""

from __future__ import annotations

import hashlib
import os


def _code() -> dict[str, str]:
    base = os.path.dirname(os.path.abspath(__file__))
    digest = hashlib.sha256()
    modules = []
    for directory, dirs, files in os.walk(base):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        modules += [os.path.join(directory, n) for n in files if n.endswith(".py")]
    for path in sorted(modules):
        st = os.stat(path)
        relative = os.path.relpath(path, base)
        digest.update(f"{relative}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return {"path": base, "digest": digest.hexdigest()[:16]}


CODE = _code()
"""This process's substrat code: ``path`` (the package's directory) and ``digest``."""


def other_code(reported: object) -> str | None:
    """Why a daemon's ``code`` (from ``daemon.status``) is not this process's, or None if
    it is the same."""
    if not isinstance(reported, dict) or not isinstance(reported.get("digest"), str):
        return "an older substrat, which does not say which code it runs"
    if reported == CODE:
        return None
    if reported.get("path") != CODE["path"]:
        return f"the substrat installed at {reported.get('path')}"
    return "this installation's code as it was before its files changed (an upgrade)"
