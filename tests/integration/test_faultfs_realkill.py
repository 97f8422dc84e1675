"""Process mode checked against reality: SIGKILL a real process at the same boundary.

The same operation sequence runs twice: under faultfs, armed at boundary b,
and in a real process on a real temporary directory, which counts boundaries by
the same rule (one before and one after each mutating call) and kills itself
with SIGKILL at b. The tree the kill leaves must equal faultfs's process image.
Each program's process is forked off one long-lived interpreter (``FORKS``).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from faultfs import FaultFS, SimulatedCrash

# Runs in both worlds. ``boundary`` is a no-op under faultfs (which counts on
# its own) and the kill switch in the child.
INTERPRETER = r"""
import os

def run(root, ops, boundary):
    fds = {}
    def p(name):
        return os.path.join(root, name)
    def mutate(call, *args):
        boundary()
        result = call(*args)
        boundary()
        return result
    for op in ops:
        kind, name = op[0], op[1]
        path = p(name)
        exists = os.path.exists(path)
        if kind == "open":
            trunc = op[2]
            flags = os.O_RDWR | os.O_CREAT | (os.O_TRUNC if trunc else 0)
            if name in fds or (exists and os.path.isdir(path)):
                continue
            if not exists or trunc:
                fds[name] = mutate(os.open, path, flags, 0o644)
            else:
                fds[name] = os.open(path, flags, 0o644)
        elif kind in ("write", "pwrite", "truncate", "fsync") and name not in fds:
            continue
        elif kind == "write":
            mutate(os.write, fds[name], op[2].encode())
        elif kind == "pwrite":
            mutate(os.pwrite, fds[name], op[2].encode(), op[3])
        elif kind == "truncate":
            mutate(os.ftruncate, fds[name], op[2])
        elif kind == "fsync":
            mutate(os.fsync, fds[name])
        elif kind == "close":
            if name in fds:
                os.close(fds.pop(name))
        elif kind == "append":
            if exists and os.path.isdir(path):
                continue
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
            fd = mutate(os.open, path, flags, 0o644) if not exists else os.open(path, flags)
            mutate(os.write, fd, op[2].encode())
            os.close(fd)
        elif kind == "buffered":
            if exists and os.path.isdir(path):
                continue
            if not exists:
                boundary()
            with open(path, "a") as handle:
                if not exists:
                    boundary()
                handle.write(op[2])
                if op[2]:
                    boundary()  # the flush at close is one write call
            if op[2]:
                boundary()
        elif kind == "fsync_dir":
            if exists and os.path.isdir(path):
                fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
                mutate(os.fsync, fd)
                os.close(fd)
        elif kind == "mkdir":
            if not exists:
                mutate(os.mkdir, path)
        elif kind in ("rename", "link"):
            target = p(op[2])
            if not exists or os.path.isdir(path) or os.path.isdir(target):
                continue
            if kind == "link" and os.path.exists(target):
                continue
            if os.path.exists(target) and os.stat(target).st_ino == os.stat(path).st_ino:
                continue
            mutate(os.replace if kind == "rename" else os.link, path, target)
        elif kind == "unlink":
            if exists and not os.path.isdir(path):
                mutate(os.unlink, path)
    for fd in fds.values():
        os.close(fd)
"""

FORKS = (
    INTERPRETER
    + r"""
import json, signal, sys, traceback
# One request a line on stdin: a program forked off this process runs it on a real
# directory and kills itself with SIGKILL at boundary kill_at (0: never); one answer
# a line on stdout: its exit status (negative: the signal) and what it wrote.
for request in sys.stdin:
    root, ops, kill_at = json.loads(request)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        count = 0
        def boundary():
            global count
            count += 1
            if count == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
        try:
            run(root, ops, boundary)
            os.write(write_end, str(count).encode())
            os._exit(0)
        except BaseException:
            os.write(write_end, traceback.format_exc().encode())
            os._exit(1)
    os.close(write_end)
    chunks = []
    while chunk := os.read(read_end, 65536):
        chunks.append(chunk)
    os.close(read_end)
    _, status = os.waitpid(pid, 0)
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    print(json.dumps([code, b"".join(chunks).decode()]), flush=True)
"""
)
"""Starts each program as a real process that runs it and is SIGKILLed, by fork: a fresh
interpreter per program cost about 12 ms of CPU, most of this file's time (2,400
programs under --run-stress), where a fork costs well under one."""


class Forks:
    """The process that forks the programs (one per module: see ``FORKS``)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", FORKS],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def run(self, root: Path, ops: list[list[Any]], kill_at: int) -> tuple[int, str]:
        """Run ``ops`` in a new process on ``root``; its exit status and its output (the
        boundary count when it finished, a traceback when it failed)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps([str(root), ops, kill_at]) + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        assert answer, f"the forking process died (status {self.proc.wait(timeout=30)})"
        code, output = json.loads(answer)
        return code, output

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        assert self.proc.wait(timeout=30) == 0


@pytest.fixture(scope="module")
def forks() -> Iterator[Forks]:
    started = Forks()
    yield started
    started.close()


_namespace: dict[str, Any] = {}
exec(INTERPRETER, _namespace)
run_program = _namespace["run"]

NAMES = ["a", "b", "d/c"]


def random_program(seed: int, length: int) -> list[list[Any]]:
    rng = random.Random(seed)
    ops: list[list[Any]] = [["mkdir", "d"]]
    for _ in range(length):
        name = rng.choice(NAMES)
        text = rng.choice(["x", "hello\n", "0123456789" * 3, ""])
        kind = rng.choice(
            ["open", "open", "write", "write", "pwrite", "truncate", "fsync", "close", "append"]
            + ["buffered", "fsync_dir", "rename", "link", "unlink"]
        )
        if kind == "open":
            ops.append([kind, name, rng.random() < 0.3])
        elif kind in ("write", "append", "buffered"):
            ops.append([kind, name, text])
        elif kind == "pwrite":
            ops.append([kind, name, text, rng.randrange(40)])
        elif kind == "truncate":
            ops.append([kind, name, rng.randrange(20)])
        elif kind == "fsync_dir":
            ops.append([kind, rng.choice(["", "d"])])
        elif kind in ("rename", "link"):
            ops.append([kind, name, rng.choice(NAMES)])
        else:
            ops.append([kind, name])
    return ops


def real_tree(root: Path) -> dict[str, bytes | None]:
    tree: dict[str, bytes | None] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        for d in dirnames:
            tree[os.path.normpath(os.path.join(rel, d))] = None
        for f in filenames:
            tree[os.path.normpath(os.path.join(rel, f))] = Path(dirpath, f).read_bytes()
    return tree


def run_child(forks: Forks, root: Path, ops: list[list[Any]], kill_at: int) -> tuple[int, str]:
    root.mkdir()
    return forks.run(root, ops, kill_at)


def faultfs_image(ops: list[list[Any]], kill_at: int) -> tuple[int, dict[str, bytes | None]]:
    fs = FaultFS("/faultfs-realkill")
    if kill_at:
        fs.arm(kill_at)
    try:
        with fs:
            run_program(fs.root, ops, lambda: None)
    except SimulatedCrash:
        pass
    assert fs.crashed == bool(kill_at)
    return fs.boundaries, fs.crash_image("process").tree()


def compare(forks: Forks, tmp_path: Path, seed: int, length: int, max_points: int) -> int:
    ops = random_program(seed, length)
    code, out = run_child(forks, tmp_path / "full", ops, 0)
    assert code == 0, out
    total, final = faultfs_image(ops, 0)
    assert total == int(out), "boundary counts differ between faultfs and reality"
    assert final == real_tree(tmp_path / "full")
    points = range(1, total + 1)
    if total > max_points:
        points = sorted(random.Random(seed).sample(points, max_points))
    for kill_at in points:
        real_root = tmp_path / f"kill{kill_at}"
        code, out = run_child(forks, real_root, ops, kill_at)
        assert code == -signal.SIGKILL, out
        _, image = faultfs_image(ops, kill_at)
        assert image == real_tree(real_root), f"seed {seed}: differs at boundary {kill_at}"
    return total


@pytest.mark.parametrize("seed", [1, 2])
def test_process_image_equals_a_real_sigkill(forks: Forks, tmp_path: Path, seed: int) -> None:
    assert compare(forks, tmp_path, seed, length=14, max_points=12) > 4


@pytest.mark.stress
@pytest.mark.parametrize("seed", range(100, 140))
def test_process_image_equals_a_real_sigkill_many_programs(
    forks: Forks, tmp_path: Path, seed: int
) -> None:
    compare(forks, tmp_path, seed, length=30, max_points=60)
