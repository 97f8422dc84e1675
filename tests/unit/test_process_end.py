"""substrat.process_end.leave: the exit's user-visible work done, the teardown skipped.

Each case runs a child interpreter (the end of a process is what is tested). The
teardown is seen through an object whose ``__del__`` writes a line: the interpreter's
exit drops the module holding it (and so runs it); ``os._exit`` does not.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

PRELUDE = textwrap.dedent(
    """
    import atexit, logging, os, sys, threading, time
    from substrat.process_end import leave

    class Torn:
        def __del__(self):
            os.write(2, b"torn down\\n")

    torn = Torn()
    atexit.register(lambda: os.write(2, b"atexit ran\\n"))
    """
)


def child(body: str) -> subprocess.CompletedProcess[str]:
    code = PRELUDE + textwrap.dedent(body)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # pipes buffer
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )


def test_the_exit_status_output_atexit_and_logging_are_kept_the_teardown_skipped() -> None:
    done = child(
        """
        handler = logging.StreamHandler(sys.stderr)
        logging.basicConfig(level="INFO", handlers=[handler])
        logging.getLogger("x").info("last line")
        print("buffered", end="")  # a pipe: block-buffered, written only by the flush
        leave(3)
        """
    )
    assert done.returncode == 3
    assert done.stdout == "buffered"
    assert done.stderr == "INFO:x:last line\natexit ran\n"  # no "torn down"


@pytest.mark.parametrize("code", [0, 1, 141, 256 + 7])
def test_the_status_is_the_one_sys_exit_gives(code: int) -> None:
    fast = child(f"leave({code})")
    slow = child(f"sys.exit({code})")
    assert fast.returncode == slow.returncode == code % 256
    assert fast.stdout == slow.stdout == ""


def test_a_running_thread_is_joined_as_by_the_interpreters_exit() -> None:
    done = child(
        """
        def late():
            time.sleep(0.2)
            os.write(1, b"thread finished\\n")

        threading.Thread(target=late).start()
        leave(4)
        """
    )
    assert done.returncode == 4
    assert done.stdout == "thread finished\n"
    assert done.stderr == "atexit ran\ntorn down\n"  # the whole exit, as before


def test_a_daemon_thread_does_not_hold_the_end() -> None:
    done = child(
        """
        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
        leave(0)
        """
    )
    assert (done.returncode, done.stderr) == (0, "atexit ran\n")


def test_an_output_that_cannot_be_flushed_ends_as_sys_exit_ends() -> None:
    broken = """
        r, w = os.pipe()
        os.dup2(w, 1)
        os.close(r)
        os.close(w)
        print("lost")
        {}(0)
        """
    fast = child(broken.format("leave"))
    slow = child(broken.format("sys.exit"))
    assert fast.returncode == slow.returncode == 120
    assert "BrokenPipeError" in slow.stderr
    assert fast.stderr == slow.stderr
