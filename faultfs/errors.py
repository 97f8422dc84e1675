"""Every exception a faultfs user can meet, each saying what to do about it."""

from __future__ import annotations

from typing import Any


class SimulatedCrash(BaseException):
    """The simulated process died at an armed boundary.

    It derives from BaseException so that ``except Exception`` in the code under
    test cannot swallow it: a real ``kill -9`` cannot be caught either. Catch it
    in the harness, then take a crash image with ``fs.crash_image(mode)``.
    """

    def __init__(self, boundary: int, phase: str, op: Any) -> None:
        super().__init__(f"simulated crash at boundary {boundary} ({phase} {op})")
        self.boundary = boundary
        self.phase = phase
        self.op = op


class IOAfterCrash(SimulatedCrash):
    """Code kept doing file I/O on a file system whose process already crashed.

    After a kill nothing runs, so cleanup code (``finally`` blocks, ``with``
    exits that flush buffers) must not reach the disk. The I/O is refused and
    not applied. It subclasses SimulatedCrash so that a ``with`` block unwinding
    from the crash still surfaces as the crash; ``fs.io_after_crash`` counts
    how often it happened.
    """

    def __init__(self, what: str) -> None:
        BaseException.__init__(
            self,
            f"{what} after the simulated crash: the process is dead, its I/O is refused; "
            "take a crash image (fs.crash_image(mode)) and run recovery on that",
        )
        self.boundary = -1
        self.phase = "dead"
        self.op = None


class FaultFSError(Exception):
    """Base class of faultfs's usage errors."""


class CrashSwallowed(FaultFSError):
    """The code under test caught SimulatedCrash and went on to acknowledge something.

    After the crash the simulated process is dead: its I/O is refused and its
    acknowledgements do not count. A bare ``except:`` or ``except BaseException:``
    catches SimulatedCrash anyway; re-raise what you do not own there. The
    message names the crash point and where the dead process went on.
    """


class ConfigError(FaultFSError, ValueError):
    """A FaultFS or explore argument is invalid; the message names the accepted values."""


class OutsideRootError(FaultFSError, PermissionError):
    """A path outside the FaultFS root was used while ``outside="refuse"``.

    Either move the path under the root, or create the FaultFS with
    ``outside="passthrough"`` to let such calls reach the real file system.
    """


class UnsupportedOperation(FaultFSError, OSError):
    """The call is valid Python but faultfs does not model it (e.g. symlinks).

    The message names the call; run that part of the program outside the root.
    """


class EscapeError(FaultFSError):
    """A call reached the real file system for a path or descriptor of an active FaultFS.

    It went through a function bound before the FaultFS was activated, where
    faultfs could not rebind it (an instance attribute, a closure, a default
    argument). The message names the function (``module:qualname``), the name
    it used and the fix. It is not an OSError, so ``except OSError`` in the
    code under test does not hide it; explore and the pytest fixtures report
    it even when the code swallowed it.
    """


class FailedHealthCheck(FaultFSError):
    """explore or a faultfs fixture would have passed without testing anything.

    ``health_check`` names the check (a :class:`faultfs.HealthCheck`); the
    message says what to do, and how to suppress the check when the run is
    what was meant.
    """

    def __init__(self, message: str, health_check: Any = None) -> None:
        super().__init__(message)
        self.health_check = health_check


class NondeterministicWorkload(FailedHealthCheck):
    """A workload run again under explore() did not reach a boundary it reached before.

    explore() runs the workload again to capture its crash points (or, with
    the check suppressed, once per boundary), so the workload must do the same
    I/O every time: seed its randomness and reset its state on entry. It is
    the ``nondeterministic`` health check.
    """

    def __init__(self, message: str) -> None:
        from faultfs._health import HealthCheck  # _health imports this module

        super().__init__(message, HealthCheck.nondeterministic)


class ExploreFailed(FaultFSError, AssertionError):
    """explore() found crash images on which recovery or its check failed.

    The message is the report: failures grouped by the call site of the
    operation at the crash, each with its trace and reproduction key. Use
    ``report.replay(failure, workload)`` to get the failing image back.
    """


class RecoveryCheckFailed(FaultFSError, AssertionError):
    """A CrashStateMachine's check failed on a recovered crash image.

    The message says which step crashed where, in which mode and profile, what
    the image kept, and how the recovered state differs from what the
    acknowledged operations require. Hypothesis prints the shrunk steps that
    reproduce it; run them again to debug.
    """
