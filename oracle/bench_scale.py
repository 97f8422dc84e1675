"""Recovery at scale: generated roots, a daemon's cold start, in-process recovery.

:func:`generate_root` writes a root the way substrat would have left it after
a clean run: session records (SUSPENDED), and per agent a log of valid,
checksummed lines (``session.created``, ``agent.created``, then turns, each a
``turn.start`` and a ``turn.complete``). Roots are spread over 100 root agents
with the rest as their children (spawned by each root's first turn), and every
child's last turn sends one message to the user, so the user's log holds one
``message.enqueued`` per child and recovery has an inbox to rebuild.

Generation is not measured. :func:`daemon_cold_start` times ``python -m
substrat.daemon`` from spawn until it answers ``ping`` over its socket and
reads the daemon's peak RSS (``VmHWM``); :func:`inprocess_open` times
``Orchestrator.open`` and reads this process's peak RSS growth.
"""

from __future__ import annotations

import asyncio
import atexit
import gc
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oracle.kill import exit_without_close
from substrat import events
from substrat.eventlog import LOG_NAME, encode_entry
from substrat.registry import REGISTRY_DIR
from substrat.session import Session, SessionState
from substrat.session.store import AGENTS_DIR, RECORD_NAME

ROOT_AGENTS = 100
"""Agents are spread over this many roots (fewer if there are fewer agents)."""
PING_POLL_S = 0.01
SMALL_ROOT_EVENTS = 200_000
"""Roots smaller than this are opened three times and the fastest run kept."""
EVENTS_PER_AGENT = 100
START_TIMEOUT_S = 600.0
_TS = "2026-01-01T00:00:00.000000+00:00"
_PROMPT = "summarise the design notes and list the open questions"
_RESPONSE = "three open questions remain: durability of the inbox, fan-out limits, blob size"


@dataclass
class ScaleRoot:
    path: Path
    agents: int
    events: int
    """Entries in the agents' logs and the user's log together."""
    bytes_on_disk: int


def _sid(kind: int, index: int) -> str:
    return f"{kind:08x}{index:024x}"


def _entry(seq: int, context: dict[str, str], event: str, data: dict[str, Any]) -> bytes:
    body: dict[str, Any] = {"seq": seq, **context, "ts": _TS, "event": event, "data": data}
    return encode_entry(body)


def _turn_lines(
    sid: str, first_seq: int, turn: int, effects: dict[str, Any]
) -> tuple[bytes, bytes]:
    context = {"session_id": sid}
    turn_id = f"t{turn}"
    prompt = f"{_PROMPT} ({turn})"
    start = _entry(first_seq, context, events.TURN_START, {"turn_id": turn_id, "prompt": prompt})
    transcript = [{"role": "user", "content": prompt}, {"role": "assistant", "content": _RESPONSE}]
    complete = _entry(
        first_seq + 1,
        context,
        events.TURN_COMPLETE,
        {
            "turn_id": turn_id,
            "prompt": prompt,
            "response": _RESPONSE,
            "transcript": transcript,
            "effects": effects,
        },
    )
    return start, complete


def _effects(**parts: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "spawns": [],
        "messages": [],
        "terminations": [],
        "delivered": [],
        "keys": [],
    }
    base.update(parts)
    return base


def generate_root(path: Path, agents: int, events_per_agent: int) -> ScaleRoot:
    """Write a root of ``agents`` agents with ``events_per_agent`` log entries each."""
    assert agents >= 1 and events_per_agent >= 4 and events_per_agent % 2 == 0
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(mode=0o700, parents=True)
    (path / AGENTS_DIR).mkdir()
    roots = min(ROOT_AGENTS, agents)
    agent_ids = [_sid(1, i) for i in range(agents)]
    sessions = [_sid(2, i) for i in range(agents)]
    parent_of = [None if i < roots else i % roots for i in range(agents)]
    children: dict[int, list[int]] = {}
    for i, parent in enumerate(parent_of):
        if parent is not None:
            children.setdefault(parent, []).append(i)
    user_lines: list[bytes] = []
    registered: list[bytes] = []
    total_bytes = 0
    turns = (events_per_agent - 2) // 2
    for i in range(agents):
        sid, agent_id = sessions[i], agent_ids[i]
        folder = path / AGENTS_DIR / sid
        folder.mkdir()
        record = Session(sid, "scripted", "scripted-1", agent_id=agent_id)
        record.state = SessionState.SUSPENDED
        (folder / RECORD_NAME).write_bytes(record.to_record())
        parent = parent_of[i]
        context = {"session_id": sid}
        name = f"agent-{i}"
        if parent is None:
            entry = {"session_id": sid, "agent_id": agent_id, "name": name}
            entry |= {"provider": "scripted", "model": "m"}
            registered.append(
                _entry(
                    len(registered) + 1, {"endpoint": REGISTRY_DIR}, events.ROOT_REGISTERED, entry
                )
            )
        lines = [
            _entry(1, context, events.SESSION_CREATED, {"provider": "scripted", "model": "m"}),
            _entry(
                2,
                context,
                events.AGENT_CREATED,
                {
                    "agent_id": agent_id,
                    "name": name,
                    "parent_session_id": None if parent is None else sessions[parent],
                    "instructions": f"you are {name}",
                },
            ),
        ]
        for turn in range(1, turns + 1):
            effects = _effects()
            if turn == 1 and parent is None:
                effects["spawns"] = [
                    {
                        "agent_id": agent_ids[c],
                        "session_id": sessions[c],
                        "name": f"agent-{c}",
                        "instructions": f"you are agent-{c}",
                        "provider": "scripted",
                        "model": "m",
                    }
                    for c in children.get(i, [])
                ]
            if turn == turns and parent is not None:
                message = {
                    "message_id": _sid(3, i),
                    "sender": agent_id,
                    "recipient": "user",
                    "kind": "result",
                    "payload": f"done: {name}",
                    "timestamp": _TS,
                    "reply_to": None,
                    "metadata": {"turn_id": f"t{turn}"},
                }
                effects["messages"] = [message]
                user_lines.append(
                    _entry(
                        len(user_lines) + 1,
                        {"endpoint": "user"},
                        events.MESSAGE_ENQUEUED,
                        message,
                    )
                )
            lines.extend(_turn_lines(sid, 2 * turn + 1, turn, effects))
        blob = b"".join(lines)
        total_bytes += len(blob)
        (folder / LOG_NAME).write_bytes(blob)
    if user_lines:
        (path / "user").mkdir()
        blob = b"".join(user_lines)
        total_bytes += len(blob)
        (path / "user" / LOG_NAME).write_bytes(blob)
    (path / REGISTRY_DIR).mkdir()
    (path / REGISTRY_DIR / LOG_NAME).write_bytes(b"".join(registered))
    return ScaleRoot(path, agents, agents * (2 + 2 * turns) + len(user_lines), total_bytes)


@dataclass
class StartResult:
    seconds: float
    """Wall-clock seconds (for the daemon: from spawn until it answered ping)."""
    peak_rss_bytes: int
    agents: int
    cpu_seconds: float = 0.0
    """CPU seconds the process spent until then (user + system)."""

    def events_per_s(self, root: ScaleRoot) -> float:
        return root.events / self.seconds

    def events_per_cpu_s(self, root: ScaleRoot) -> float:
        return root.events / self.cpu_seconds


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime, stime


def _peak_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmHWM for pid {pid}")


_bytecode_prefix: str | None = None
_warmed: set[tuple[str, str]] = set()
"""(interpreter, PYTHONPATH) pairs whose bytecode is in the benchmark's cache."""
_IMPORT_ALL = (
    "import importlib, pkgutil, substrat\n"
    "for module in pkgutil.walk_packages(substrat.__path__, 'substrat.'):\n"
    "    importlib.import_module(module.name)\n"
)


def daemon_environment() -> dict[str, str]:
    """The environment a measured daemon starts in: with bytecode, as an installed daemon has it.

    pip compiles a package's modules when it installs it, and an editable
    install writes their bytecode at the first import. Where writing bytecode
    is off (``PYTHONDONTWRITEBYTECODE``, as in this project's sandboxes) and
    no ``PYTHONPYCACHEPREFIX`` is set, every measured daemon would compile
    substrat from source at every start: about 0.1 CPU s here, the cost of
    more than a thousand agents' start, which no deployed daemon pays and
    which would sit on both sides of every ratio. Such a daemon gets a
    bytecode cache of the benchmark's own (a temporary directory, removed at
    exit), filled before the first measured start (:func:`_warm`). A prefix
    the user set, or bytecode writing left on, is kept as it is.
    """
    global _bytecode_prefix
    env = dict(os.environ)
    if not env.get("PYTHONDONTWRITEBYTECODE") or env.get("PYTHONPYCACHEPREFIX"):
        return env
    if _bytecode_prefix is None:
        _bytecode_prefix = tempfile.mkdtemp(prefix="substrat-bench-pycache-")
        atexit.register(shutil.rmtree, _bytecode_prefix, True)
    del env["PYTHONDONTWRITEBYTECODE"]
    env["PYTHONPYCACHEPREFIX"] = _bytecode_prefix
    return env


def _warm(env: dict[str, str], timeout_s: float) -> None:
    """Fill the benchmark's bytecode cache for this code tree, once, before it is measured.

    Every substrat module is imported, then a daemon is started on a new empty
    root and stopped, so that what a start imports at run time is compiled too.
    """
    key = (sys.executable, env.get("PYTHONPATH", ""))
    if env.get("PYTHONPYCACHEPREFIX") != _bytecode_prefix or key in _warmed:
        return
    _warmed.add(key)
    subprocess.run([sys.executable, "-c", _IMPORT_ALL], env=env, check=True, timeout=timeout_s)
    with tempfile.TemporaryDirectory(prefix="substrat-bench-warm-") as tmp:
        empty = ScaleRoot(Path(tmp) / "root", 0, 0, 0)
        empty.path.mkdir(mode=0o700)  # an empty directory is adopted only if private
        daemon_cold_start(empty, timeout_s=timeout_s)


def daemon_cold_start(root: ScaleRoot, *, timeout_s: float = START_TIMEOUT_S) -> StartResult:
    """Spawn the daemon on ``root``; seconds until it answers ``ping``, and its peak RSS.

    The daemon runs with bytecode (:func:`daemon_environment`), so a start is
    measured as a deployed daemon pays it, not with substrat compiled anew.
    """
    from substrat.client import Client, ping

    env = daemon_environment()
    _warm(env, timeout_s)
    command = [sys.executable, "-m", "substrat.daemon", "--root", str(root.path), "--no-wake"]
    log_path = root.path.parent / f"{root.path.name}.daemon.log"
    with open(log_path, "ab") as out:
        started = time.perf_counter()
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
            env=env,
        )
    try:
        deadline = started + timeout_s
        while True:
            answer = ping(root.path, timeout_s=1.0)
            if answer is not None and answer.get("pid") == proc.pid:
                seconds = time.perf_counter() - started
                break
            if proc.poll() is not None or time.perf_counter() > deadline:
                raise RuntimeError(f"daemon did not come up on {root.path}; see {log_path}")
            time.sleep(PING_POLL_S)
        peak = _peak_rss(proc.pid)
        cpu = _cpu_seconds(proc.pid)
        with Client(root.path, timeout_s=10.0).connect(10.0) as client:
            status = client.call("daemon.status")
        agents = int(status["agents"]) if isinstance(status, dict) else -1
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return StartResult(seconds, peak, agents, cpu)


def inprocess_open(root: ScaleRoot, repeat: int = 1) -> StartResult:
    """Time ``Orchestrator.open`` on ``root`` in a fresh child process (clean peak RSS).

    With ``repeat`` the fastest of that many runs (CPU time) is kept.
    """
    if repeat > 1:
        return min((inprocess_open(root) for _ in range(repeat)), key=lambda r: r.cpu_seconds)
    code = (
        "import json,sys;from oracle.bench_scale import _inprocess_child;"
        "print(json.dumps(_inprocess_child(sys.argv[1])))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(root.path)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    data = json.loads(out.strip().splitlines()[-1])
    return StartResult(data["seconds"], data["peak_rss_bytes"], data["agents"], data["cpu"])


def _inprocess_child(root: str) -> dict[str, Any]:
    from substrat.orchestrator import Orchestrator

    gc.collect()
    started, cpu = time.perf_counter(), time.process_time()
    orch = asyncio.run(Orchestrator.open(root))
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    agents = len(orch.tree)
    exit_without_close(orch)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"seconds": seconds, "cpu": cpu, "peak_rss_bytes": peak, "agents": agents}


def parse_floor(root: ScaleRoot) -> float:
    """CPU seconds to read every log of ``root`` and ``json.loads`` each line: the floor."""
    started = time.process_time()
    count = 0
    for log in [*root.path.glob(f"{AGENTS_DIR}/*/{LOG_NAME}"), root.path / "user" / LOG_NAME]:
        if not log.exists():
            continue
        with open(log, "rb") as handle:
            for line in handle:
                json.loads(line)
                count += 1
    seconds = time.process_time() - started
    assert count == root.events, (count, root.events)
    return seconds


def main() -> None:  # pragma: no cover - a manual check: python -m oracle.bench_scale
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(description="recovery of one generated root")
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--events-per-agent", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="substrat-scale-") as tmp:
        root = generate_root(Path(tmp) / "root", args.agents, args.events_per_agent)
        floor = parse_floor(root)
        inproc = inprocess_open(root)
        daemon = daemon_cold_start(root)
        print(f"{root.events} events, {root.bytes_on_disk / 2**20:.0f} MiB")
        print(f"parse floor: {root.events / floor:,.0f} events/s")
        print(
            f"in-process open: {inproc.events_per_s(root):,.0f} events/s, "
            f"peak RSS {inproc.peak_rss_bytes / 2**20:.0f} MiB, {inproc.agents} agents"
        )
        print(
            f"daemon cold start: {daemon.events_per_s(root):,.0f} events/s, "
            f"peak RSS {daemon.peak_rss_bytes / 2**20:.0f} MiB, {daemon.agents} agents"
        )


if __name__ == "__main__":  # pragma: no cover
    main()


def scale_rows(scales: list[int], *, single_agent: bool = True) -> list[Any]:
    """The recovery rows of the benchmark table (see :mod:`oracle.bench`)."""
    import tempfile

    from oracle.bench_table import MIB, Row

    rows: list[Row] = []
    growth: list[tuple[ScaleRoot, StartResult, StartResult]] = []
    floor_name = "json.loads of every line, per CPU s (floor)"
    with tempfile.TemporaryDirectory(prefix="substrat-scale-") as tmp:
        empty = ScaleRoot(Path(tmp) / "empty", 0, 0, 0)
        # private, as a new root must be: the daemon refuses a group- or world-readable one
        empty.path.mkdir(mode=0o700)
        # interpreter, imports, lock, socket: what a daemon costs before any log
        fixed_s = daemon_cold_start(empty).cpu_seconds
        for index, events_wanted in enumerate(sorted(scales)):
            root = generate_root(
                Path(tmp) / f"root{index}", max(1, events_wanted // 100), EVENTS_PER_AGENT
            )
            repeat = 3 if root.events < SMALL_ROOT_EVENTS else 1
            growth.append((root, inprocess_open(root, repeat), daemon_cold_start(root)))
            if index < len(scales) - 1:
                shutil.rmtree(root.path)
        largest, inproc, daemon = growth[-1]
        floor = largest.events / parse_floor(largest)
        label = f"{largest.agents:,} agents x {EVENTS_PER_AGENT} events"
        rows += [
            Row(
                f"recovery, {label}: cold start to ping (daemon), events/s wall",
                daemon.events_per_s(largest),
                "/s",
                floor_name,
                floor,
                target=">= 500,000/s",
                met=daemon.events_per_s(largest) >= 500_000,
            ),
            Row(
                f"recovery, {label}: the same per daemon CPU second",
                daemon.events_per_cpu_s(largest),
                "/s",
                floor_name,
                floor,
            ),
            Row(
                f"recovery, {label}: daemon peak RSS",
                daemon.peak_rss_bytes / MIB,
                "MiB",
                "log bytes on disk",
                largest.bytes_on_disk / MIB,
                higher_is_better=False,
                target="< 1,024 MiB",
                met=daemon.peak_rss_bytes < 1024 * MIB,
            ),
            Row(
                f"recovery, {label}: Orchestrator.open in process, events/CPU s",
                inproc.events_per_cpu_s(largest),
                "/s",
                floor_name,
                floor,
            ),
        ]
        first_root, first_inproc, first_daemon = growth[0]
        for root, opened, _ in growth:
            rows.append(
                Row(
                    f"growth: Orchestrator.open, {root.events:,} events, CPU s",
                    opened.cpu_seconds,
                    "s",
                    f"linear from {first_root.events:,} events",
                    first_inproc.cpu_seconds * root.events / first_root.events,
                    higher_is_better=False,
                )
            )
        per_event_s = (first_daemon.cpu_seconds - fixed_s) / first_root.events
        for root, _, started in growth:
            rows.append(
                Row(
                    f"growth: daemon CPU s until it answers ping, {root.events:,} events",
                    started.cpu_seconds,
                    "s",
                    f"empty root ({fixed_s:.2f} s) + linear from {first_root.events:,} events",
                    fixed_s + per_event_s * root.events,
                    higher_is_better=False,
                )
            )
        shutil.rmtree(largest.path)
        if single_agent:
            one = generate_root(Path(tmp) / "single", 1, max(scales))
            one_floor = one.events / parse_floor(one)
            one_daemon = daemon_cold_start(one)
            one_label = f"recovery, 1 agent x {one.events:,} events"
            rows += [
                Row(
                    f"{one_label}: cold start to ping (daemon), events/s wall",
                    one_daemon.events_per_s(one),
                    "/s",
                    floor_name,
                    one_floor,
                    target=">= 500,000/s",
                    met=one_daemon.events_per_s(one) >= 500_000,
                ),
                Row(
                    f"{one_label}: the same per daemon CPU second",
                    one_daemon.events_per_cpu_s(one),
                    "/s",
                    floor_name,
                    one_floor,
                ),
                Row(
                    f"{one_label}: daemon peak RSS",
                    one_daemon.peak_rss_bytes / MIB,
                    "MiB",
                    "log bytes on disk",
                    one.bytes_on_disk / MIB,
                    higher_is_better=False,
                    target="< 1,024 MiB",
                    met=one_daemon.peak_rss_bytes < 1024 * MIB,
                ),
            ]
    return rows
