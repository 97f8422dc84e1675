"""Code that caught SimulatedCrash and went on: the dead process's acknowledgements.

A crash ends the simulated process. A bare ``except:`` or ``except BaseException:``
in the code under test catches SimulatedCrash anyway, and the program goes on:
its I/O is refused (IOAfterCrash), but an acknowledgement it makes then would be
recorded as one the crash image must keep, and the check would blame the store
for losing it, with a wrong cause and a wrong fix. faultfs refuses it instead,
naming the crash point and where the dead process went on.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from faultfs._trace import call_stack, display_path
from faultfs.errors import CrashSwallowed

if TYPE_CHECKING:
    from faultfs._syscalls import Syscalls

FIX = (
    "SimulatedCrash derives from BaseException because a kill -9 cannot be caught; a bare "
    "`except:` or `except BaseException:` in the code under test catches it anyway. "
    "Re-raise what you do not own there (`except BaseException: ...; raise`), or catch "
    "Exception instead"
)


def _site(site: str) -> str:
    filename, _, line = site.rpartition(":")
    return f"{display_path(filename, os.getcwd())}:{line}" if filename else "an unknown line"


def refuse_ack(fs: Syscalls, what: str, depth: int = 3) -> CrashSwallowed:
    """The error for ``what`` (an acknowledgement) on the crashed ``fs``; recorded on it too,
    so a harness still stops if the code under test swallows this error as well."""
    site = _site(call_stack(depth)[1])
    if fs.crash_point is not None:
        boundary, phase, op = fs.crash_point
        path = os.path.relpath(op.path, fs.root) if op.path else "?"
        where = f"at boundary {boundary} ({phase} the {op.kind} of {path}"
        where += f" at {_site(op.site)})" if op.site else ")"
    else:
        where = "that ended the run"
    went_on = ""
    if fs.first_io_after_crash is not None:
        call, io_site = fs.first_io_after_crash
        went_on = f"; its first I/O after the crash: {call} at {_site(io_site)} (refused)"
    message = (
        f"{what} at {site} came after the simulated crash {where}: the process is dead, so "
        f"nothing it acknowledges counts. The code caught SimulatedCrash and went on{went_on}. "
        f"{FIX}."
    )
    if fs.crash_swallowed is None:
        fs.crash_swallowed = message
    return CrashSwallowed(message)


def check(fs: Syscalls) -> None:
    """Raise the recorded refusal, even when the code under test swallowed it."""
    if fs.crash_swallowed is not None:
        raise CrashSwallowed(fs.crash_swallowed)
