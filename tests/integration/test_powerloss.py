"""The power-loss campaign (oracle.powerloss): a short run on LazyFS, and the campaign itself.

The LazyFS run skips, saying how to get LazyFS, when it is missing. The rest
needs no LazyFS: the same cycles on a plain directory (SIGKILL only), a loss
planted between the cut and the check that the campaign must report, and the
command line's answer when LazyFS is absent.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from oracle import powerloss
from oracle.daemon_driver import Served, served_differences
from oracle.losses import lost_between
from oracle.powerloss import MIN_ACKS_PER_CYCLE, lazyfs_unavailable_reason, run_campaign
from oracle.powerloss_disk import CANARY_NAME, leftover_campaigns
from substrat import recovery
from substrat.agents import USER

REPO = Path(__file__).resolve().parents[2]
COMMAND_TIMEOUT_S = 60
PLANT_CYCLES = 10


def _env_without_lazyfs() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "LAZYFS_BIN"}
    env["PATH"] = os.pathsep.join(["/usr/bin", "/bin", str(Path(sys.executable).parent)])
    return env


def test_power_loss_cycles_on_lazyfs_lose_nothing_acknowledged(tmp_path: Path) -> None:
    reason = lazyfs_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    report = run_campaign(tmp_path / "out", cycles=3, seed=8, max_run_s=0.6, inject_probability=0.5)
    print(report.render())
    assert report.problems == []
    assert report.ok and report.cycles == 3 and report.losses == 0
    assert report.power_cuts + report.lazyfs_crashes == 3
    assert report.cuts_verified == 3, "a cut kept the unsynced canary"
    assert f"- disk: lazyfs ({report.lazyfs_binary}), seed 8" in report.render()
    assert report.acknowledged > 10, "the workload did too little to mean anything"
    assert (tmp_path / "out" / "daemon.log").stat().st_size > 0
    assert not (tmp_path / "out" / "state-at-failure").exists()


def test_the_campaign_on_a_plain_directory_loses_nothing(tmp_path: Path) -> None:
    report = run_campaign(tmp_path / "out", cycles=2, seed=3, max_run_s=0.5, lazyfs=False)
    assert report.problems == []
    assert report.ok and report.disk == "plain" and report.cycles == 2
    assert report.lazyfs_crashes == 0 and report.power_cuts == 2
    assert report.acknowledged >= 2 * MIN_ACKS_PER_CYCLE
    assert report.agents_at_end > 0 and report.turns_at_end > 0
    assert report.cuts_verified == 0
    assert "cuts that dropped unsynced data: not checked" in report.render()
    # Each checked cycle says what became of the operation in flight, the same everywhere.
    flights = [c.in_flight for c in report.cycle_results if c.in_flight]
    assert len(flights) == report.in_flight_at_cut
    assert all(f.startswith(("done: #", "undone: #")) for f in flights), flights
    assert sum(f.startswith("done: ") for f in flights) == report.in_flight_applied
    assert [c["in_flight"] for c in report.to_dict()["cycle_results"] if c["in_flight"]] == flights


def test_a_cut_that_drops_nothing_fails_the_campaign(tmp_path: Path) -> None:
    """A "power cut" that keeps unsynced data (here: a plain directory) tested nothing.

    This is what a LazyFS that does not drop its cache would look like: every
    acknowledged operation survives, so only the canary can tell.
    """
    report = run_campaign(
        tmp_path / "out", cycles=3, seed=3, max_run_s=0.3, lazyfs=False, verify_cuts=True
    )
    assert not report.ok and report.cycles == 0 and report.cuts_verified == 0
    assert report.losses == 0  # nothing acknowledged was lost: the cut simply did nothing
    [problem] = report.problems
    assert problem.startswith("cycle 1: the power cut dropped nothing: 8192 bytes")
    assert CANARY_NAME in problem and "LAZYFS_BIN" in problem
    assert "cuts that dropped unsynced data: 0 of 1" in report.render()


def _drop_completed_turns(planted: list[tuple[int, int]]) -> Callable[[Path], None]:
    """Plant a loss: cut every completed turn out of the busiest live agent's log (once).

    A terminated agent's turns are not served any more, so cutting them would
    lose nothing the check could see: only agents that recovery keeps alive
    count. Not only those whose log says ``agent.terminated``: a cascade the cut
    stopped short, or a committed ``@terminate``, ends an agent at recovery with
    nothing in its own log (seen once under load: seven turns cut, no loss to
    report). The read-only recovery plan says which agents stay.
    ``planted`` gets (the cycle, 1-based, the number of lines cut).
    """
    cycles: list[Path] = []

    def plant(state_dir: Path) -> None:
        cycles.append(state_dir)
        staying = {
            a.session_id
            for a in recovery.analyze(state_dir).agents
            if a.status == "live" or a.status.startswith("record")
        }
        texts = [
            (p, p.read_text())
            for p in (state_dir / "agents").glob("*/events.jsonl")
            if p.parent.name in staying
        ]
        logs = sorted(
            (text.count('"event":"turn.complete"'), str(p))
            for p, text in texts
            if '"event":"agent.terminated"' not in text
        )
        if planted or not logs or logs[-1][0] < 2:
            return  # too little acknowledged yet; a later cycle plants it
        path = Path(logs[-1][1])
        lines = path.read_text().splitlines(True)
        kept = [line for line in lines if "turn.complete" not in line]
        _write_durably(path, kept)
        planted.append((len(cycles), len(lines) - len(kept)))

    return plant


def _write_durably(path: Path, lines: list[str]) -> None:
    with open(path, "w") as handle:
        handle.writelines(lines)
        handle.flush()
        os.fsync(handle.fileno())


def test_a_loss_planted_after_the_cut_is_reported(tmp_path: Path) -> None:
    out = tmp_path / "out"
    planted: list[tuple[int, int]] = []
    # Enough cycles for two turns to complete in one log on a loaded machine (four were
    # not, once, in a main job on 2 cores); the campaign stops at the failure anyway.
    report = run_campaign(
        out,
        cycles=PLANT_CYCLES,
        seed=5,
        max_run_s=0.5,
        lazyfs=False,
        after_cut=_drop_completed_turns(planted),
    )
    assert planted, f"no log held two completed turns in {PLANT_CYCLES} cycles: nothing planted"
    cycle, cut = planted[0]
    assert not report.ok, f"{cut} lines cut after cycle {cycle}'s cut, and nothing was reported"
    assert report.cycles == cycle - 1  # it stops at the cycle that found it (cycles: those passed)
    # The turns cut out are named, one by one; the one in flight at the cut may be among
    # them without being a loss (it was never acknowledged). Children the cut turns had
    # spawned lose their place too, so other agents' turns may follow.
    per_agent = Counter(t.split(" turn ")[0] for t in report.lost.turns)
    assert cut - 1 <= per_agent.most_common(1)[0][1] <= cut
    assert report.losses == report.lost.count >= len(report.lost.turns)
    text = "\n".join(report.problems)
    assert "recovered state matches no allowed outcome" in text
    assert "conversation of" in text
    rendered = report.render()
    assert "FAIL" in rendered and f"{len(report.lost.turns)} turns (" in rendered
    # The disk as it was at the failure is kept for reproduction.
    assert list((out / "state-at-failure" / "agents").iterdir())


def _delete_every_agent_in_cycle(cycle: int) -> Callable[[Path], None]:
    """Plant the loss of every agent directory after the cut of cycle ``cycle`` (1-based)."""
    seen: list[Path] = []

    def plant(state_dir: Path) -> None:
        seen.append(state_dir)
        if len(seen) == cycle:
            for agent_dir in (state_dir / "agents").iterdir():
                shutil.rmtree(agent_dir)

    return plant


def test_the_failing_cycle_is_counted_with_what_it_lost(tmp_path: Path) -> None:
    """Its acknowledged operations are in the totals; every lost agent is named."""
    report = run_campaign(
        tmp_path / "out",
        cycles=3,
        seed=11,
        max_run_s=0.3,
        lazyfs=False,
        after_cut=_delete_every_agent_in_cycle(2),
    )
    assert not report.ok and report.cycles == 1
    first, failing = report.cycle_results
    assert first.ok and first.lost.count == 0 and not failing.ok
    assert first.acknowledged >= MIN_ACKS_PER_CYCLE
    assert failing.acknowledged >= MIN_ACKS_PER_CYCLE
    assert report.acknowledged == first.acknowledged + failing.acknowledged
    # Every acknowledged agent was deleted: each is named, with its turns.
    assert report.agents_at_end > 0
    assert len(report.lost.agents) == len(failing.lost.agents) >= 1
    if re.match(r"#\d+ terminate\(", failing.in_flight):
        # The check allows the in-flight termination as applied (its subtree gone
        # legitimately) and reports the smaller loss: at most every agent.
        assert len(report.lost.agents) <= report.agents_at_end
        assert len(report.lost.turns) <= report.turns_at_end
    else:
        assert len(report.lost.agents) == report.agents_at_end
        assert len(report.lost.turns) == report.turns_at_end
    assert report.losses == report.lost.count > 0
    rendered = report.render()
    assert f"acknowledged operations: {report.acknowledged} in 2 cycles" in rendered
    # The lost agents as counted, not agents_at_end: with a termination in flight the
    # count may be smaller (above); a CI-like run of ddfc8bd drew such a cut (7 losses,
    # 10 agents at the end).
    assert f"acknowledged and lost: {report.losses}: {len(report.lost.agents)} agent" in rendered
    assert "| 2 (FAILED) |" in rendered
    assert report.to_dict()["cycle_results"][1]["lost_count"] == failing.lost.count


def test_lost_between_names_every_lost_agent_turn_and_message() -> None:
    lead, kid, ghost = "a" * 32, "b" * 32, "c" * 32
    want = Served(
        agents={lead: ("lead", None, ""), kid: ("kid", lead, "")},
        turns={lead: [("p1", "r1"), ("p2", "r2"), ("p3", "r3")], kid: [("k1", "r")]},
        inboxes={lead: {"m1", "m2"}, kid: {"m3"}, USER: {"u1"}},
    )
    got = Served(
        agents={lead: ("lead", None, ""), ghost: ("ghost", None, "")},
        turns={lead: [("p1", "r1"), ("p2", "changed")], ghost: []},
        inboxes={lead: {"m2", "m9"}, ghost: set(), USER: set()},
    )
    lost = lost_between(want, got)
    assert lost.agents == [f"kid ({'b' * 8})"]
    assert lost.turns == [
        f"lead ({'a' * 8}) turn 2: 'p2'",
        f"lead ({'a' * 8}) turn 3: 'p3'",
        f"kid ({'b' * 8}) turn 1: 'k1'",
    ]
    assert lost.messages == [
        f"m3 in the inbox of kid ({'b' * 8})",
        f"m1 in the inbox of lead ({'a' * 8})",
        "u1 in the inbox of user",
    ]
    assert lost.count == 7
    assert lost.summary(shown=1).startswith(f"1 agent (kid ({'b' * 8})), 3 turns (lead")
    assert lost_between(want, want).count == 0 and lost_between(want, want).summary() == "nothing"


def test_without_lazyfs_the_command_fails_saying_how_to_get_it(tmp_path: Path) -> None:
    env = _env_without_lazyfs()
    command = [sys.executable, "-m", "oracle.powerloss", "--cycles", "1", "--out"]
    failed = subprocess.run(
        [*command, str(tmp_path / "a")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )
    assert failed.returncode == 2
    assert "LazyFS is not available" in failed.stderr
    assert "LAZYFS_BIN" in failed.stderr and "docs/lazyfs.md" in failed.stderr
    skipped = subprocess.run(
        [*command, str(tmp_path / "b"), "--skip-without-lazyfs"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )
    assert skipped.returncode == 0
    assert "SKIPPED" in skipped.stdout and "docs/lazyfs.md" in skipped.stdout


def test_the_ci_script_fails_without_lazyfs_unless_told_to_skip(tmp_path: Path) -> None:
    env = _env_without_lazyfs() | {"POWERLOSS_OUT": str(tmp_path / "out")}
    script = [str(REPO / "ci" / "powerloss.sh")]
    failed = subprocess.run(
        script, env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S
    )
    assert failed.returncode == 2
    assert "LazyFS is not available" in failed.stderr
    skipped = subprocess.run(
        script,
        env=env | {"POWERLOSS_REQUIRE_LAZYFS": "0"},
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )
    assert skipped.returncode == 0 and "SKIPPED" in skipped.stdout
    bad = subprocess.run(
        script,
        env=env | {"POWERLOSS_CYCLES": "0"},
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )
    assert bad.returncode == 2 and "POWERLOSS_CYCLES" in bad.stderr
    tools = tmp_path / "bin"  # what the script needs before python, and no python
    tools.mkdir()
    for tool in ("bash", "dirname", "date"):
        (tools / tool).symlink_to(shutil.which(tool) or f"/usr/bin/{tool}")
    no_python = subprocess.run(
        script,
        env=env | {"PATH": str(tools)},
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )
    assert no_python.returncode == 2 and "no 'python' on PATH" in no_python.stderr


def test_importing_the_campaign_does_not_load_the_lazyfs_driver() -> None:
    probe = "import sys, oracle.powerloss; print(json.dumps('faultfs.lazyfs' in sys.modules))"
    result = subprocess.run(
        [sys.executable, "-c", "import json; " + probe],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) is False


def test_served_differences_name_every_kind_of_loss() -> None:
    want = Served(
        agents={"a" * 32: ("lead", None, "root lead"), "b" * 32: ("kid", "a" * 32, "k")},
        turns={"a" * 32: [("p1", "r1"), ("p2", "r2")], "b" * 32: []},
        inboxes={"a" * 32: {"m1"}, "b" * 32: set(), USER: {"u1", "u2"}},
    )
    same = Served(
        agents=dict(want.agents),
        turns={k: list(v) for k, v in want.turns.items()},
        inboxes={k: set(v) for k, v in want.inboxes.items()},
    )
    assert served_differences(want, same) == []
    got = Served(
        agents={"a" * 32: ("lead", None, "root lead"), "c" * 32: ("ghost", None, "")},
        turns={"a" * 32: [("p1", "r1")], "c" * 32: []},
        inboxes={"a" * 32: set(), "c" * 32: set(), USER: {"u1", "u2", "u3"}},
    )
    assert served_differences(want, got) == [
        f"lost agent kid ({'b' * 8})",
        f"unexpected agent ghost ({'c' * 8})",
        f"conversation of lead ({'a' * 8}): expected 2 turns, served 1; first difference at turn 2",
        f"inbox of lead ({'a' * 8}): lost messages ['m1']",
        "inbox of user: unexpected messages ['u3']",
    ]


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{entry.name}: {cmdline}")
    return found


@pytest.mark.parametrize("disk", ["plain", "lazyfs"])
def test_sigterm_stops_the_campaign_and_leaves_nothing_running(tmp_path: Path, disk: str) -> None:
    """A cancelled CI job (SIGTERM) leaves no daemon, LazyFS, mount or temp dir, and a report."""
    if disk == "lazyfs":
        reason = lazyfs_unavailable_reason()
        if reason is not None:
            pytest.skip(reason)
    work = tmp_path / "tmp"
    work.mkdir()
    out = tmp_path / "out"
    command = [sys.executable, "-m", "oracle.powerloss", "--cycles", "200", "--max-run-s", "0.2"]
    command += ["--out", str(out)] + (["--plain-dir"] if disk == "plain" else [])
    proc = subprocess.Popen(
        command,
        cwd=REPO,
        env=os.environ | {"TMPDIR": str(work)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # the first cycle has run: a daemon is up for the second
            if line.startswith("cycle 1/200"):
                break
        else:
            pytest.fail(f"the campaign ended before its first cycle: {proc.wait()}")
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=COMMAND_TIMEOUT_S)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, rest
    assert "interrupted" in rest
    assert "campaign interrupted (SIGINT or SIGTERM) in cycle" in (out / "report.md").read_text()
    assert json.loads((out / "report.json").read_text())["ok"] is False
    assert _processes_mentioning(str(work)) == []
    assert list(work.iterdir()) == []
    assert str(work) not in Path("/proc/self/mountinfo").read_text()


def test_a_signal_whose_interrupt_a_finalizer_dropped_still_stops_the_campaign(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The handler's KeyboardInterrupt can land in a finalizer, where Python drops it
    ("Exception ignored in"); the campaign must stop anyway, not run on with both
    signals ignored (the SIGTERM test above once waited 60 s for all 200 cycles)."""
    made: list[str] = []
    mkdtemp = tempfile.mkdtemp

    def recorded_mkdtemp(*args: Any, **kwargs: Any) -> str:
        made.append(mkdtemp(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(powerloss.tempfile, "mkdtemp", recorded_mkdtemp)
    monkeypatch.setattr(powerloss, "_SIGNALLED", [])
    dropped: list[type[BaseException] | None] = []
    monkeypatch.setattr(
        sys, "unraisablehook", lambda unraisable: dropped.append(unraisable.exc_type)
    )

    def sigterm_inside_a_finalizer(line: str) -> None:
        if not line.startswith("cycle 1/"):
            return

        def finalizer() -> None:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(COMMAND_TIMEOUT_S)  # the handler runs here and raises

        class Garbage:
            pass

        garbage = Garbage()
        weakref.finalize(garbage, finalizer)
        del garbage  # the finalizer runs now, in this frame's thread

    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        powerloss._raise_on_sigterm()
        with pytest.raises(powerloss.CampaignInterrupted) as raised:
            run_campaign(
                tmp_path / "out",
                cycles=30,
                max_run_s=0.05,
                lazyfs=False,
                log=sigterm_inside_a_finalizer,
            )
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
    assert dropped == [KeyboardInterrupt], "the interrupt was not dropped: nothing was tested"
    report = raised.value.report
    assert report.cycles == 1, "the campaign went on after the signal"
    assert "campaign interrupted (SIGINT or SIGTERM) in cycle 1" in report.render()
    [work] = [path for path in made if "substrat-powerloss-" in path]
    assert _processes_mentioning(work) == []
    assert not os.path.exists(work)


def test_a_binary_that_is_not_lazyfs_is_refused_with_status_2_and_a_report(
    tmp_path: Path,
) -> None:
    fake = tmp_path / "lazyfs"
    fake.write_text("#!/bin/sh\necho 'I am not LazyFS'\nexit 0\n")
    fake.chmod(0o755)
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "oracle.powerloss", "--cycles", "1", "--out", str(out)],
        cwd=REPO,
        env=os.environ | {"LAZYFS_BIN": str(fake)},
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    [said] = result.stderr.splitlines()[-1:]
    assert said.startswith("powerloss: cannot run. LazyFS is not available: ")
    if lazyfs_unavailable_reason(str(fake)) is None:  # FUSE is usable: the binary was run
        assert f"{fake} did not mount a LazyFS file system" in said
        assert "I am not LazyFS" in said and "docs/lazyfs.md" in said
    report = (out / "report.md").read_text()
    assert report.startswith("# Power-loss campaign: NOT RUN")
    assert "LazyFS is not available" in report
    assert not (out / "state-at-failure").exists()


def test_mounts_left_by_killed_campaigns_are_named_with_their_processes(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    work = "/tmp/x y/substrat-powerloss-abc"
    for pid, argv in {
        41: ["lazyfs", f"{work}/mnt", "--config-path", "lazyfs.toml"],
        42: ["python", "-m", "substrat.daemon", "--root", f"{work}/root"],
        43: ["python", "-m", "substrat.daemon", "--root", "/elsewhere/root"],
    }.items():
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (proc / "self").mkdir()
    mountinfo = "\n".join(
        [
            "20 1 0:5 / /proc rw - proc proc rw",
            f"90 20 0:77 / {work.replace(' ', chr(92) + '040')}/mnt rw - fuse.lazyfs lazyfs rw",
            "91 20 0:78 / /mnt/other rw - fuse.sshfs host: rw",
        ]
    )
    [found] = leftover_campaigns(mountinfo, proc)
    assert found == (
        f"{work}/mnt is still mounted (processes: 41, 42); if no campaign runs there any "
        f"more: kill 41 42; fusermount3 -u {work}/mnt"
    )
    assert leftover_campaigns("20 1 0:5 / /proc rw - proc proc rw", proc) == []


def test_a_campaign_killed_with_sigkill_is_named_by_the_next(tmp_path: Path) -> None:
    """SIGKILL cannot be cleaned up after; the next run names what was left and how to stop it."""
    reason = lazyfs_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    work = tmp_path / "tmp"
    work.mkdir()
    command = [sys.executable, "-m", "oracle.powerloss", "--cycles", "200", "--max-run-s", "0.2"]
    proc = subprocess.Popen(
        [*command, "--out", str(tmp_path / "killed")],
        cwd=REPO,
        env=os.environ | {"TMPDIR": str(work)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        if line.startswith("cycle 1/200"):
            break
    proc.kill()
    proc.wait()
    [mount] = [str(p / "mnt") for p in work.iterdir()]
    try:
        [found] = [x for x in leftover_campaigns() if x.startswith(mount)]
        pids = [int(p) for p in found.split("(processes: ")[1].split(")")[0].split(", ")]
        assert len(pids) >= 1 and f"fusermount3 -u {mount}" in found
        report = run_campaign(
            tmp_path / "next", cycles=1, seed=2, max_run_s=0.2, inject_probability=0.0
        )
        assert report.ok, report.problems
        assert any(mount in note for note in report.notes)
        assert "## Notes" in report.render() and f"fusermount3 -u {mount}" in report.render()
    finally:
        for text in _processes_mentioning(str(work)):
            os.kill(int(text.split(":")[0]), signal.SIGKILL)
        subprocess.run(["fusermount3", "-uz", mount], capture_output=True)
    assert _processes_mentioning(str(work)) == []
