"""A process that holds a root as an offline ``substrat compact`` does, for tests of what
the commands that find it there say."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_FAKE_COMPACT = """\
import sys
from pathlib import Path
from substrat.root_hold import RootHold
from substrat.rpc.lock import RootLock
held = RootLock.acquire(sys.argv[2], retry_s=0)
hold = RootHold.take(Path(sys.argv[2]))
print("held", flush=True)
sys.stdin.read()
"""


@contextmanager
def compacting(root: Path, scratch: Path) -> Iterator[subprocess.Popen[str]]:
    """A process whose command line reads as ``substrat compact ROOT`` holding ``root``'s
    lock and the root itself (as compact does) until its stdin closes; killed at the end.
    Its program is written under ``scratch``."""
    program = scratch / "bin" / "substrat"
    program.parent.mkdir(exist_ok=True)
    program.write_text(_FAKE_COMPACT)
    holder = subprocess.Popen(
        [sys.executable, str(program), "compact", str(root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        yield holder
    finally:
        holder.kill()
        holder.wait()
