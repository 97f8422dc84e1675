"""A run's objects are collected at exit with what existed before frozen, whatever froze first.

faultfs freezes the objects that exist when the outermost FaultFS activates
(gc.freeze), so the collection at its exit (a crashed run's finalizers meet the
dead disk) walks only the run's own garbage. It used to freeze only when the
freeze count was 0, and Python 3.12 starts with a few hundred tuples of its own
in the permanent generation: there faultfs never froze, and every exit walked
the whole heap (three quarters of a CrashStateMachine's CPU on 3.12.1). These
tests start a fresh interpreter whose count is not 0 before faultfs loads, as
3.12's is, and check the freeze in that real process.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

PROGRAM = textwrap.dedent(
    """
    import gc, json, sys
    kept = [[i] for i in range(50)]
    gc.freeze()  # frozen before faultfs loads, as Python 3.12 starts
    from faultfs import FaultFS
    counts = [gc.get_freeze_count()]
    for _ in range(2):
        with FaultFS(sys.argv[1]) as fs:
            with open(fs.path("f"), "w") as f:
                f.write("x")
            counts.append(gc.get_freeze_count())
        counts.append(gc.get_freeze_count())
    print(json.dumps(counts))
    """
)


def test_objects_before_activation_are_frozen_when_something_froze_first(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(tmp_path / "root")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    start, active1, after1, active2, after2 = (int(n) for n in out.strip()[1:-1].split(","))
    assert start >= 50
    # each activation froze what existed (the interpreter, faultfs, the 50 lists) ...
    assert active1 > start + 1000 and active2 > 1000, out
    # ... and each deactivation left nothing frozen, so the next one freezes again
    assert after1 == 0 and after2 == 0, out
