"""The daemons that the tests' warm ``substrat`` commands start (tests/support/warm_server.py's
zygote): the command's own child, seen and ending as a fresh daemon does.

A command run through tests/support/warm.py forks a zygote before it runs; the zygote
becomes the daemon the command starts through ``DaemonProcess.spawn``. These tests
compare such a daemon with the one a fresh command starts (Popen).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_warm_daemons import (
    PROBE_COMMAND,
    children_left,
    normalized_log,
    settled_view,
)
from tests.support import warm
from tests.support.cli import SUBSTRAT

pytestmark = pytest.mark.waits

# Run in a command's child: the probe through the zygote, or fresh (Popen), as
# DaemonProcess.spawn starts it; what it saw and its exit status.
COMMAND = r"""
import json, os, subprocess, sys
from substrat.client import DaemonProcess
probe, log, how = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
with open(log, "ab") as out:
    if how == "zygote":
        proc = DaemonProcess.spawn.zygote.start(probe, out.fileno(), None)
    else:
        proc = subprocess.Popen(probe, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                start_new_session=True, close_fds=True)
print(json.dumps({"kind": type(proc).__name__, "parent": os.getpid(),
                  "exit": proc.wait(timeout=60)}))
"""


@pytest.fixture(autouse=True)
def warm_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(warm.FRESH, raising=False)


def in_command(*args: str, **kwargs: Any) -> dict[str, Any]:
    proc = warm.run(
        [sys.executable, "-c", COMMAND, *args],
        capture_output=True,
        text=True,
        timeout=120,
        **kwargs,
    )
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


def test_a_commands_daemon_sees_itself_as_a_fresh_one(tmp_path: Path) -> None:
    seen = {}
    for how in ("zygote", "fresh"):
        log = tmp_path / f"{how}.log"
        ran = in_command(json.dumps(PROBE_COMMAND), str(log), how)
        assert ran["exit"] == 0
        assert ran["kind"] == ("ChildDaemon" if how == "zygote" else "Popen")
        seen[how] = json.loads(log.read_text().splitlines()[0])
        seen[how]["fds"] = {
            fd: target.replace(str(log), "LOG") for fd, target in seen[how]["fds"].items()
        }
        del seen[how]["random"]
    # sys.flags.safe_path: the CLI's server is not -P (its commands are not); the rest agrees
    safe_path = sys.flags.__match_args__.index("safe_path")
    assert (seen["zygote"]["flags"][safe_path], seen["fresh"]["flags"][safe_path]) == (0, 1)
    seen["zygote"]["flags"][safe_path] = 1
    assert seen["zygote"] == seen["fresh"]
    assert set(seen["fresh"]["fds"]) == {"0", "1", "2"} and seen["fresh"]["session"]


def daemon_pid(root: Path) -> int:
    status = warm.run(
        [SUBSTRAT, "daemon", "status", "--json", "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return int(json.loads(status.stdout)["pid"])


def test_a_daemon_a_command_starts_runs_and_stops_as_a_fresh_one(tmp_path: Path) -> None:
    counted = tmp_path / "counts"
    env = {**os.environ, "SUBSTRAT_TEST_WARM_COUNTS": str(counted)}
    views, logs = [], []
    for runner in (subprocess.run, warm.run):
        root = tmp_path / runner.__module__.rsplit(".", 1)[-1]
        start = [SUBSTRAT, "daemon", "start", "--root", str(root)]
        started = runner(start, capture_output=True, text=True, timeout=120, env=env)
        assert started.returncode == 0, started.stderr
        pid = daemon_pid(root)
        views.append(settled_view(pid, root))
        stop = [SUBSTRAT, "daemon", "stop", "--root", str(root)]
        assert warm.run(stop, capture_output=True, timeout=120).returncode == 0
        logs.append(normalized_log(root, pid))
    assert views[0] == views[1] and views[0]["session"]
    assert logs[0] == logs[1] and "stopped cleanly" in logs[0][-1]
    lines = [json.loads(line) for line in counted.read_text().splitlines()]
    assert [line for line in lines if "daemon in a command: warm" in line] != []


def test_signals_and_exit_of_a_commands_daemon(tmp_path: Path) -> None:
    code = (
        "import os, signal, sys; from substrat.client import DaemonProcess\n"
        "p = DaemonProcess(sys.argv[1]).start()\n"
        "kind = type(p.proc).__name__\n"
        "os.kill(p.pid, signal.SIGKILL)\n"
        "killed = p.wait(60)\n"
        "p.kill()\n"  # a second kill and wait (a finally's) as Popen's: the status kept
        "q = DaemonProcess(sys.argv[1]).start()\n"  # the zygote is used: fresh
        "print(kind, killed, type(q.proc).__name__, q.terminate())\n"
    )
    done = warm.run(
        [sys.executable, "-c", code, str(tmp_path / "root")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stdout.split() == ["ChildDaemon", str(-signal.SIGKILL), "Popen", "0"], done.stderr


def test_a_commands_zygote_leaves_nothing(tmp_path: Path) -> None:
    show = "import os; print(open(f'/proc/self/task/{os.getpid()}/children').read())"
    done = warm.run([sys.executable, "-c", show], capture_output=True, text=True, timeout=60)
    (zygote,) = done.stdout.split()  # the command's only child, until its exit
    assert not Path(f"/proc/{zygote}").exists()  # killed and reaped at the command's exit
    # A command killed by its timeout: the zygote sees its parent gone and exits.
    wait = show + "; import sys; sys.stdout.flush(); import time; time.sleep(600)"
    with pytest.raises(subprocess.TimeoutExpired) as raised:
        warm.run([sys.executable, "-c", wait], capture_output=True, text=True, timeout=5)
    (zygote,) = (raised.value.stdout or b"").split()
    deadline = time.monotonic() + 30
    while Path(f"/proc/{int(zygote)}/stat").exists() and time.monotonic() < deadline:
        if Path(f"/proc/{int(zygote)}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            break  # exited; its new parent reaps it
        time.sleep(0.05)
    assert time.monotonic() < deadline
    server = warm.get_server()
    assert server is not None and children_left(server.process.pid) == []


def test_what_could_start_differently_starts_fresh_from_a_command(tmp_path: Path) -> None:
    utf8 = "0" if os.environ.get("PYTHONUTF8") == "1" else "1"
    code = (
        "import os, sys; from substrat.client import DaemonProcess\n"
        "z = DaemonProcess.spawn.zygote\n"
        "d = [sys.executable, '-P', '-m', 'substrat.daemon', '--root', sys.argv[1]]\n"
        "print(z.refusal(d, None))\n"
        f"print(z.refusal(d, {{**os.environ, 'PYTHONUTF8': '{utf8}'}}))\n"
        "print(z.refusal([sys.executable, '-m', 'substrat.daemon'], None))\n"
        "print(z.refusal([*d, 'x' * 100000], None))\n"
        "import signal; signal.signal(signal.SIGUSR1, signal.SIG_IGN)\n"
        "print(z.refusal(d, None))\n"
    )
    done = warm.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert done.stdout.split("\n")[:5] == [
        "None",
        "environment",
        "program",
        "command line",
        "identity",
    ], done.stderr
