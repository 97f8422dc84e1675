"""faultfs: a crash-counter I/O shim with a page-cache model.

Run a program against a simulated file system, stop it at any write, fsync or
rename boundary, and get back the disk a kill -9, a power loss, a torn write
or a reordering file system would leave. See docs/faultfs.md.
"""

from faultfs._platform import unsupported_reason as _unsupported_reason

if _unsupported_reason() is None:
    from faultfs._causes import Step
    from faultfs._explore import explore
    from faultfs._fs import DEFAULT_IMAGE_LIMIT, FaultFS, ImageOrigin, Snapshot
    from faultfs._health import HealthCheck
    from faultfs._images import MODES
    from faultfs._profiles import PROFILES, Profile
    from faultfs._report import Cause, ExploreReport, Failure
    from faultfs._trace import Frame, Op
    from faultfs.errors import (
        ConfigError,
        CrashSwallowed,
        EscapeError,
        FailedHealthCheck,
        FaultFSError,
        IOAfterCrash,
        NondeterministicWorkload,
        OutsideRootError,
        SimulatedCrash,
        UnsupportedOperation,
    )
else:  # Windows: nothing else of faultfs can even be imported here (see faultfs._platform)

    def __getattr__(name: str) -> object:
        raise ImportError(_unsupported_reason())


__all__ = [
    "DEFAULT_IMAGE_LIMIT",
    "MODES",
    "PROFILES",
    "Cause",
    "ConfigError",
    "CrashSwallowed",
    "EscapeError",
    "ExploreReport",
    "FailedHealthCheck",
    "Failure",
    "FaultFS",
    "FaultFSError",
    "Frame",
    "HealthCheck",
    "IOAfterCrash",
    "ImageOrigin",
    "NondeterministicWorkload",
    "Op",
    "OutsideRootError",
    "Profile",
    "SimulatedCrash",
    "Snapshot",
    "Step",
    "UnsupportedOperation",
    "explore",
]
