"""Real daemons forked off one interpreter that has imported the daemon already.

The SIGKILL campaign (tests/integration/test_daemon_crash_campaign.py) restarts the
daemon after every kill. A fresh ``python -m substrat.daemon`` takes 0.12-0.13 CPU s to
answer on an empty root (Python 3.11, with bytecode), most of it importing the daemon, so
a five-kill item's six starts were most of its CPU. Forked off a process that imported
it, a daemon answers after 0.01-0.03 CPU s; what the campaign tests (what a SIGKILL
leaves on disk, and the restart's recovery of it) runs unchanged, in a process of its own
that is killed as before. The entry point ``python -m substrat.daemon`` is what the other
daemon tests start.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from substrat.client import _wait_for_ping, prepare_root
from substrat.errors import DaemonStartError

SERVER = r"""
import json, os, random, signal, sys
import substrat.daemon

# One request a line on stdin, one answer a line on stdout:
# ["start", root, log]: fork a daemon on root (output appended to log); its pid.
# ["poll", pid]: its exit status if it has exited (reaped), else null.
# ["kill", pid]: SIGKILL it and reap it; its exit status.
for request in sys.stdin:
    kind, *args = json.loads(request)
    if kind == "start":
        root, log = args
        pid = os.fork()
        if pid == 0:
            code = 70
            try:
                os.setsid()
                random.seed()  # not the state every fork would share
                null = os.open(os.devnull, os.O_RDONLY)
                out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                os.dup2(null, 0)
                os.dup2(out, 1)
                os.dup2(out, 2)
                os.close(null)
                os.close(out)
                code = substrat.daemon.main(["--root", root])
            finally:
                os._exit(code)
        answer = pid
    elif kind == "poll":
        done, status = os.waitpid(args[0], os.WNOHANG)
        answer = os.waitstatus_to_exitcode(status) if done else None
    else:
        try:
            os.kill(args[0], signal.SIGKILL)
        except ProcessLookupError:
            pass
        answer = os.waitstatus_to_exitcode(os.waitpid(args[0], 0)[1])
    print(json.dumps(answer), flush=True)
"""


class DaemonForks:
    """The process the daemons are forked off; one a campaign, closed at its end."""

    def __init__(self) -> None:
        # -P: as DaemonProcess, the working directory does not go on sys.path.
        self.proc = subprocess.Popen(
            [sys.executable, "-P", "-c", SERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def ask(self, *request: Any) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        assert answer, f"the forking process died (status {self.proc.wait(timeout=30)})"
        return json.loads(answer)

    def close(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        try:
            assert self.proc.wait(timeout=30) == 0
        finally:
            # unclosed, it is a ResourceWarning: an error under PYTHONWARNINGS=error
            self.proc.stdout.close()

    def __enter__(self) -> DaemonForks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ForkedDaemon:
    """One daemon of ``forks`` on ``root``: ``DaemonProcess``'s start and kill."""

    def __init__(self, forks: DaemonForks, root: Path) -> None:
        self.forks = forks
        self.root = root.expanduser().absolute()
        self.pid: int | None = None
        self.status: int | None = None

    def poll(self) -> int | None:
        """Its exit status once it has exited (``_wait_for_ping`` asks), else None."""
        if self.status is None and self.pid is not None:
            self.status = self.forks.ask("poll", self.pid)
        return self.status

    def start(self, timeout_s: float) -> ForkedDaemon:
        prepare_root(self.root)
        log = self.root / "daemon.log"
        self.pid = self.forks.ask("start", str(self.root), str(log))
        if _wait_for_ping(self.root, timeout_s, self) is None:  # type: ignore[arg-type]
            code = self.poll()
            self.kill()
            state = "did not answer" if code is None else f"exited with status {code}"
            raise DaemonStartError(f"the forked daemon for {self.root} {state}; see {log}")
        return self

    def kill(self) -> None:
        """SIGKILL, and wait until it is gone (the next start finds the root free)."""
        if self.pid is not None and self.status is None:
            self.status = self.forks.ask("kill", self.pid)
