"""Run a child process as an ordinary user would: file modes apply to it.

The tests run as root here, and root reads a mode-000 file (CAP_DAC_OVERRIDE,
CAP_DAC_READ_SEARCH). :func:`unprivileged` returns a ``preexec_fn`` that drops
those two capabilities from the child's bounding set (``prctl(PR_CAPBSET_DROP)``),
so after its ``exec`` the child, and everything it starts (a daemon spawned by
the CLI inherits the bounding set), is refused exactly as a non-root user
would be. For a test run that is not root there is nothing to drop.
"""

from __future__ import annotations

import ctypes
import functools
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable

from tests.conftest import other_user_bytecode_prefix

PR_CAPBSET_DROP = 24
CAP_DAC_OVERRIDE = 1
CAP_DAC_READ_SEARCH = 2


def _drop_dac_capabilities() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"prctl(PR_CAPBSET_DROP, {cap}): {os.strerror(err)}")


def unprivileged() -> Callable[[], None] | None:
    """The ``preexec_fn`` for a child that file modes apply to (None: nothing to drop)."""
    return _drop_dac_capabilities if os.geteuid() == 0 else None


def why_not_available() -> str | None:
    """None if a child started with :func:`unprivileged` is refused a mode-000 file;
    else why not (for a skip reason)."""
    with tempfile.TemporaryDirectory() as scratch:
        secret = os.path.join(scratch, "secret")
        with open(secret, "w") as handle:
            handle.write("x")
        os.chmod(secret, 0)
        try:
            probe = subprocess.run(
                [sys.executable, "-c", f"open({secret!r}).read()"],
                preexec_fn=unprivileged(),
                capture_output=True,
                text=True,
                timeout=60,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            return f"cannot start a child without CAP_DAC_OVERRIDE: {exc}"
    if probe.returncode == 0:
        return "a child without CAP_DAC_OVERRIDE/CAP_DAC_READ_SEARCH still read a mode-000 file"
    if "PermissionError" not in probe.stderr:
        return f"the probe failed for another reason: {last_line(probe.stderr)}"
    return None


def last_line(output: str, limit_chars: int = 200) -> str:
    """The last non-blank line of a child's output (a traceback's is the exception), whole
    words only, for a skip reason that says what went wrong rather than a cut-off frame."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    if not lines:
        return "no output"
    line = lines[-1]
    if len(line) <= limit_chars:
        return line
    return line[:limit_chars].rsplit(" ", 1)[0] + " ..."


OTHER_UID = 65534
"""``nobody``: the other user of the tests that need one."""


def as_other_user(uid: int = OTHER_UID) -> tuple[list[str], dict[str, str]] | str:
    """A copy of :func:`_other_user`'s answer (asked once per process: its probe is a start
    of the CLI as ``uid``)."""
    how = _other_user(uid)
    return how if isinstance(how, str) else (list(how[0]), dict(how[1]))


@functools.cache
def _other_user(uid: int) -> tuple[list[str], dict[str, str]] | str:
    """``(argv prefix, env)`` running ``python`` as ``uid`` with this checkout importable, or
    why that cannot be done here (for a skip reason).

    ``setpriv`` switches the uid; this interpreter may live where ``uid`` cannot read it
    (pyenv under a mode-0700 /root), so the first interpreter of the same Python version
    that ``uid`` can run is used, given this checkout and this environment's packages on
    ``PYTHONPATH`` (both must be readable by ``uid``), and a bytecode cache of its own
    beside the session's (tests/conftest.py), so that its children do not compile
    substrat, its dependencies and the standard library from source at each start.
    """
    import shutil
    import site

    if os.geteuid() != 0:
        return "acting as another uid needs root"
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return "setpriv (util-linux) is missing"
    checkout = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([checkout, *site.getsitepackages()]))
    env.pop("PYTHONHOME", None)
    theirs = other_user_bytecode_prefix(uid)
    if theirs is not None:
        env["PYTHONPYCACHEPREFIX"] = theirs
    switch = [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    whys = []
    for python in (sys.executable, f"/usr/bin/python{version}", "/usr/bin/python3"):
        # it must be able to start itself again (the CLI spawns the daemon with it)
        probe_code = (
            "import subprocess, sys, substrat.cli, orjson; "
            "subprocess.run([sys.executable, '-c', ''], check=True); "
            "print(sys.version_info[:2])"
        )
        try:
            probe = subprocess.run(
                [*switch, python, "-c", probe_code],
                env=env,
                cwd="/",
                capture_output=True,
                text=True,
                timeout=60,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            whys.append(f"{python}: {exc}")
            continue
        if probe.returncode == 0 and probe.stdout.strip() == str(sys.version_info[:2]):
            return [*switch, python], env
        whys.append(f"{python}: {last_line(probe.stderr or probe.stdout)}")
    return f"no Python {version} that uid {uid} can run with this checkout ({'; '.join(whys)})"
