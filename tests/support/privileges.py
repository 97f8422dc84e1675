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
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable

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
        return f"the probe failed for another reason: {probe.stderr.strip()[-200:]}"
    return None
