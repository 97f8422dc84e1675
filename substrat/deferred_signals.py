"""Hold SIGINT and SIGTERM back while a child process is being spawned.

``subprocess.Popen`` forks, then waits for the child's exec. An interrupt whose
Python handler raises (Ctrl-C's ``KeyboardInterrupt``, or a SIGTERM handler like
the power-loss campaign's) can land in that wait: the exception leaves ``Popen``
after the child exists and before the caller holds it, so nothing can kill it
and a daemon is left running (seen: a cancelled power-loss campaign, once in a
loaded test run). Here such a signal is noted and its handler called once the
block is over, when the caller has the process.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

HELD = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM handled by Python code wait; after it, their
    handlers run in arrival order. Signals left to the OS (ignored, default) and any other
    thread than the main one (where no handler runs) are left as they are."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[tuple[int, FrameType | None]] = []

    def note(signum: int, frame: FrameType | None) -> None:
        arrived.append((signum, frame))

    before = {}
    for signum in HELD:
        handler = signal.getsignal(signum)
        if callable(handler):
            before[signum] = handler
            signal.signal(signum, note)
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
        for number, frame in arrived:
            now = signal.getsignal(number)  # a handler may change what comes next
            if callable(now):
                now(number, frame)
