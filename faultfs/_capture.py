"""Capturing crash states while a run goes on (see :meth:`faultfs.FaultFS.capture_at`).

Arming a crash at boundary b and re-running the workload for every b costs a
run per boundary. Capturing keeps, at each planned boundary, the state an
armed crash there would have left (a crashed copy of the file system), and
lets the run continue: one run yields them all.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from faultfs._trace import Op
from faultfs.errors import ConfigError

if TYPE_CHECKING:
    from faultfs._fs import FaultFS


def plan(now: int, boundaries: Iterable[int]) -> list[int]:
    """The absolute boundaries to capture, last first (the counter pops them in order)."""
    wanted = set()
    for n in boundaries:
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ConfigError(
                f"capture_at needs boundaries >= 1 (counted from now, as arm(n)), got {n!r}"
            )
        wanted.add(now + n)
    return sorted(wanted, reverse=True)


def crashed_copy(fs: FaultFS, phase: str, op: Op) -> FaultFS:
    """What ``fs`` would be had an armed crash stopped it here: crashed, with its
    crash point, trace, acknowledgements and a copy of its disk-and-cache model
    (file contents shared copy-on-write). Its open descriptors are not kept: the
    process they belonged to is the one that goes on running."""
    twin = type(fs)(
        fs.root,
        fs.profile,
        fs.outside,
        block_size=fs.block_size,
        record_trace=fs._record_trace,
    )
    twin.model = fs.model.clone()
    twin.acked = list(fs.acked)
    twin.ack_marks = list(fs.ack_marks)
    twin.ack_buffered = list(fs.ack_buffered)
    twin.origin = fs.origin
    twin.watch_outside = fs.watch_outside
    twin.touches = fs.touches
    twin.outside_calls = fs.outside_calls
    twin.outside_examples = list(fs.outside_examples)
    twin.escapes = list(fs.escapes)
    twin._preopened = fs._preopened  # its images check the same pre-opened descriptors
    twin.trace = list(fs.trace)
    twin.op_inodes = dict(fs.op_inodes)
    twin.boundaries = fs.boundaries
    twin.crashed = True
    twin.crash_point = (fs.boundaries, phase, op)
    return twin
