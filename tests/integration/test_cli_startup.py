"""What a ``substrat`` command process loads: every CLI call (and every CLI test) pays it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from substrat import client
from substrat.client import ping, stop_daemon
from substrat.rootdir import prepare_root
from substrat.rpc.transport import socket_path
from tests.support.cli import SUBSTRAT

# What the interpreter loaded before the command counts as the interpreter's: a ``.pth``
# file in site-packages may import anything at start-up (a CI image's certifi hook loads
# tempfile), and that is no cost of the command.
PROBE = """
import sys
at_startup = set(sys.modules)
import json
from substrat.cli import main
try:
    main()
except SystemExit:
    pass
print(json.dumps(sorted(set(sys.modules) - at_startup)), file=sys.stderr)
"""


def loaded_by(
    where: Path, *args: str, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run ``substrat *args`` in ``where`` (its output into pipes: no terminal); the modules
    it loaded beyond the interpreter's own start-up."""
    environ = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=where,  # as a user would run it: not from the source tree
        env={**environ, **(env or {})},
    )
    return done, set(json.loads(done.stderr.strip().splitlines()[-1]))


def loaded_on_a_root(where: Path, *args: str) -> set[str]:
    """What a ``--json`` command loads on a root (``where/root``) with no daemon: it runs
    up to its request, which finds none."""
    root = where / "root"
    if not root.exists():
        prepare_root(root)
    done, loaded = loaded_by(where, *args, "--no-autostart", "--root", str(root))
    assert "DaemonNotRunningError" in done.stderr, done.stderr  # it got as far as sending
    return loaded


def test_a_json_command_loads_neither_rich_nor_the_daemons_side(tmp_path: Path) -> None:
    done, loaded = loaded_by(
        tmp_path, "agent", "list", "--json", "--no-autostart", "--root", str(tmp_path)
    )
    assert "NotARootError" in done.stderr  # it ran: an empty directory is no root
    assert not rich_in(loaded)
    # The daemon's RPC methods (asyncio, the server) and the entry-point scan of the
    # provider names (importlib.metadata) are not needed to send a request.
    assert not loaded & {"asyncio", "substrat.rpc.methods", "substrat.rpc.server"}
    assert "importlib.metadata" not in loaded


def rich_in(loaded: set[str]) -> set[str]:
    return {m for m in loaded if m == "rich" or m.startswith("rich.")}


def test_an_error_for_people_is_drawn_by_rich_on_a_terminal_only(tmp_path: Path) -> None:
    # Into a pipe rich would write the bare text: the line is written without it.
    args = ("agent", "list", "--no-autostart", "--root", str(tmp_path))
    done, loaded = loaded_by(tmp_path, *args)
    assert done.stderr.startswith("error: no substrat root at") and not rich_in(loaded)
    # FORCE_COLOR makes rich take the pipe for a terminal: the styles are drawn, by rich
    done, loaded = loaded_by(tmp_path, *args, env={"FORCE_COLOR": "1"})
    assert "\x1b[1;31merror:" in done.stderr and "rich.console" in loaded


def test_the_provider_choices_are_listed_when_asked(tmp_path: Path) -> None:
    done, _ = loaded_by(tmp_path, "agent", "create", "--help")
    assert "[claude-code|fake|openai|paced|scripted]" in done.stdout
    done, _ = loaded_by(
        tmp_path, "agent", "create", "x", "--provider", "nope", "--root", str(tmp_path)
    )
    assert "'nope' is not one of 'claude-code', 'fake', 'openai', 'paced', 'scripted'" in (
        done.stderr
    )


def test_a_command_on_a_root_loads_none_of_the_storage_modules(tmp_path: Path) -> None:
    # The root check needs the storage modules' names only for a root without the
    # marker (one made before it); every process used to load the logs, the
    # checkpoints and the session store for them.
    root = tmp_path / "root"
    prepare_root(root)
    done, loaded = loaded_by(
        tmp_path, "agent", "list", "--json", "--no-autostart", "--root", str(root)
    )
    assert "DaemonNotRunningError" in done.stderr  # it ran: the root is fine, no daemon
    storage = {
        "substrat.eventlog",
        "substrat.logs",
        "substrat.checkpoints",
        "substrat.session.store",
        "substrat.registry",
    }
    assert not loaded & storage, sorted(loaded & storage)


MAKE_ROOT_PROBE = """
import json, sys
from substrat import rootdir
at_startup = set(sys.modules)
rootdir.prepare_root(sys.argv[1])
print(json.dumps(sorted(set(sys.modules) - at_startup)))
"""


def test_making_a_root_loads_none_of_the_logs_modules(tmp_path: Path) -> None:
    # `daemon start` and `agent create` on a new path make the root there: its marker
    # carries the time as the log writes it, and importing the event log's module for
    # that loaded its readers and segments too (about 20 ms of such a command's CPU).
    # The command's other modules are loaded before the probe's count starts.
    new = tmp_path / "new"
    done = subprocess.run(
        [sys.executable, "-c", MAKE_ROOT_PROBE, str(new)],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads((new / "substrat-root.json").read_text())["created_at"]
    loaded = set(json.loads(done.stdout.strip().splitlines()[-1]))
    logs = {"substrat.eventlog", "substrat.logread", "substrat.segments"}
    assert not loaded & logs, sorted(loaded & logs)


def test_the_daemon_starts_from_a_directory_holding_a_substrat_directory(tmp_path: Path) -> None:
    # A clone's parent directory holds ``substrat/`` (the clone): ``python -m`` puts the
    # working directory first on sys.path, and the daemon process imported that
    # directory as a namespace package instead of the installed substrat.
    (tmp_path / "substrat").mkdir()
    (tmp_path / "oracle").mkdir()
    root = tmp_path / "root"
    started = subprocess.run(
        [SUBSTRAT, "daemon", "start", "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    try:
        log = root / "daemon.log"
        assert started.returncode == 0, started.stderr + (log.read_text() if log.exists() else "")
        answer = ping(root)
        assert answer is not None and answer["pong"] is True, answer
    finally:
        stop_daemon(root)


def test_a_command_loads_its_own_module_only_and_what_a_start_needs_only_to_start(
    tmp_path: Path,
) -> None:
    # The other commands' modules (with tempfile, shutil and the compressors for `demo`),
    # subprocess (to start a daemon), hashlib (a fingerprint of provider settings), signal
    # (to stop a daemon that does not answer), shlex (to quote a command in advice) and
    # substrat.access (the words for an unreadable file) are not needed to send a request
    # to a running daemon.
    loaded = loaded_on_a_root(tmp_path, "agent", "list", "--json")
    others = {
        f"substrat.cli.{name}"
        for name in ("daemon_cmds", "offline_cmds", "chat", "events_cmds", "compact_cmds")
    }
    assert not loaded & others, sorted(loaded & others)
    unneeded = {"tempfile", "subprocess", "hashlib", "signal", "shlex", "substrat.access"}
    assert not loaded & unneeded, sorted(loaded & unneeded)
    done, loaded = loaded_by(tmp_path, "daemon", "status", "--json", "--root", f"{tmp_path}/root")
    assert '"running": false' in done.stdout
    assert "substrat.cli.daemon_cmds" in loaded and "substrat.cli.agent_cmds" not in loaded


def test_the_commonest_commands_print_for_people_without_rich(tmp_path: Path) -> None:
    # What the test suite and scripts run most, their output into a pipe: rich would
    # draw no style there, and importing it was a quarter of each command's CPU.
    root = tmp_path / "root"
    try:
        for args, says in (
            (("daemon", "start"), "daemon started"),
            (("agent", "create", "lead"), "created lead"),
            (("agent", "send", "lead", "hello"), "scripted reply"),
            (("agent", "send", "lead", "hello", "--no-stream"), "scripted reply"),
            (("agent", "send", "nobody", "hello"), "no agent nobody"),
            (("agent", "show", "lead"), "turns 2"),  # its turns: lines, not tables
            (("log", "lead"), "── turn t2 (#2)"),
            (("agent", "list", "-q"), ""),
            (("agent", "rm", "lead"), "terminated 1 agent: lead"),
            (("daemon", "status"), "running pid"),
            (("daemon", "stop"), "daemon stopped"),
            (("daemon", "status"), "no daemon running"),
        ):
            done, loaded = loaded_by(tmp_path, *args, "--root", str(root))
            assert says in done.stdout + done.stderr, (args, done.stdout, done.stderr)
            assert not rich_in(loaded), (args, sorted(rich_in(loaded))[:3])
    finally:
        stop_daemon(root)


def test_agent_create_with_a_built_in_provider_scans_no_installed_package(
    tmp_path: Path,
) -> None:
    loaded = loaded_on_a_root(tmp_path, "agent", "create", "x", "--provider", "fake", "--json")
    assert not loaded & {"importlib.metadata", "substrat.providers.registry"}


def test_agent_create_on_a_new_root_asks_the_provider_without_loading_the_daemon(
    tmp_path: Path,
) -> None:
    # A new root's daemon would refuse the model: the command asks the provider as that
    # daemon would, from the daemon's providers, not from the daemon's whole module.
    new = tmp_path / "new"
    done, loaded = loaded_by(
        tmp_path, "agent", "create", "x", "--provider", "fake", "--model", "nope",
        "--root", str(new),
    )  # fmt: skip
    assert "the fake provider has one model" in done.stderr and "no root was made" in done.stderr
    assert not new.exists()
    assert not loaded & {"substrat.daemon", "asyncio", "substrat.demo", "substrat.orchestrator"}


class _Running:
    """A daemon process that runs and never answers (``_wait_for_ping`` polls it)."""

    pid = 0

    def poll(self) -> int | None:
        return None


def test_a_start_pings_the_daemon_only_once_its_socket_is_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each failed ping also looks for a daemon whose socket was removed: while the new
    # daemon recovers (no socket yet) the wait looks for the socket only.
    root = prepare_root(tmp_path / "root")
    pinged: list[Path] = []

    def ping(where: Path, timeout_s: float = 2.0) -> None:
        pinged.append(where)

    monkeypatch.setattr(client, "ping", ping)
    assert client._wait_for_ping(root, 0.3, _Running()) is None  # type: ignore[arg-type]
    assert pinged == []
    socket_path(root).touch()  # bound (a plain file does as well: nobody answers on it)
    assert client._wait_for_ping(root, 0.3, _Running()) is None  # type: ignore[arg-type]
    assert pinged and set(pinged) == {root}


DAEMON_PROBE = """
import json, sys
at_startup = set(sys.modules)
from substrat.daemon import build_registry
from substrat.providers import registry
built = build_registry()
declared = registry._may_declare(registry.ENTRY_POINT_GROUP)
print(json.dumps({"loaded": sorted(set(sys.modules) - at_startup), "declared": declared}))
"""


def test_a_daemon_start_loads_no_entry_point_machinery_and_no_difflib(tmp_path: Path) -> None:
    # The daemon's module and its providers, as every start builds them: the scan of the
    # installed packages' entry points needs importlib.metadata (email, zipfile, csv: about
    # a sixth of a start's CPU) only when a package declares a substrat provider, and the
    # "did you mean" of an unknown agent name (difflib) only when one is asked for.
    done = subprocess.run(
        [sys.executable, "-c", DAEMON_PROBE], capture_output=True, text=True, timeout=60,
        cwd=tmp_path,
    )  # fmt: skip
    probe = json.loads(done.stdout.strip().splitlines()[-1])
    loaded = set(probe["loaded"])
    assert "substrat.rpc.server" in loaded and "difflib" not in loaded
    # (a package on this machine that declares a provider makes the scan needed: then
    # importlib.metadata reads it, tests/unit/test_entry_point_scan.py)
    assert probe["declared"] or "importlib.metadata" not in loaded
