"""A process's end once nothing is owed: the exit's user-visible work, then ``os._exit``.

The interpreter's own exit, after the work users see (joining threads, the ``atexit``
callbacks, which include logging's last flush, and flushing stdout and stderr), drops
every module and object one by one. A daemon forked off an interpreter that had imported
it already (the tests' warm servers) writes to, and so copies, nearly every page it
shares with its parent doing so; a fresh one frees what it built. Nothing of it reaches
a file or the user: what a substrat process writes durably is written and fsynced by
the code that makes it (a SIGKILL at any point loses nothing acknowledged; the crash
fuzzers and the SIGKILL tests check it), so skipping the teardown leaves on disk what a
SIGKILL right after the same point would, plus everything flushed here.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn


def leave(code: int) -> NoReturn:
    """End the process with exit status ``code`` as ``sys.exit(code)`` would, without
    the interpreter's teardown.

    Falls back to ``sys.exit`` (the interpreter's whole exit, as before) wherever the
    teardown could still do something seen: a thread other than a daemon thread still
    running (the exit would join it), or a standard stream that cannot be flushed (the
    exit reports it and ends with status 120).
    """
    main = threading.main_thread()
    if any(t is not main and not t.daemon and t.is_alive() for t in threading.enumerate()):
        sys.exit(code)
    # as the interpreter's exit does after the threads: the callbacks (logging.shutdown,
    # weakref finalizers, concurrent.futures), which it then runs no more
    atexit._run_exitfuncs()
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except Exception:
        sys.exit(code)  # the exit flushes again and says why, as before
    os._exit(code)
