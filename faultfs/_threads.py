"""Where a worker thread's I/O came from: the code that submitted the work to a pool.

An operation is located at the first frame of the user's code on its stack.
A thread pool that runs a built-in directly (aiofiles hands ``partial(f.write,
data)`` to ``run_in_executor``) leaves none on the worker's stack: only
``concurrent/futures/thread.py`` and ``threading.py``. While faultfs
intercepts, ``ThreadPoolExecutor.submit`` records the submitter's frames
(one short stack walk per submission), and the worker reads them when its own
stack has no user frame.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from faultfs._trace import WORKER, Frame, call_stack

real_submit = ThreadPoolExecutor.submit


class _Submitted:
    """The submitted callable, run with its submitter's frames known to the worker."""

    __slots__ = ("fn", "frames")

    def __init__(self, fn: Any, frames: tuple[Frame, ...]) -> None:
        self.fn = fn
        self.frames = frames

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        previous = getattr(WORKER, "frames", None)
        WORKER.frames = self.frames
        try:
            return self.fn(*args, **kwargs)
        finally:
            WORKER.frames = previous


def submit(self: ThreadPoolExecutor, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
    frames, _site = call_stack(2)
    return real_submit(self, _Submitted(fn, frames), *args, **kwargs)
