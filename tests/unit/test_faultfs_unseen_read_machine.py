"""CrashStateMachine names a read from C or Rust as explore and the fixtures do (review s27d).

A state machine whose ``recover()`` (or rule, or check) reads a file through polars or
pyarrow given a path saw their bare ``FileNotFoundError`` for a file the model holds: in a
crashed step it became ``RecoveryCheckFailed`` ("recovery raised FileNotFoundError ..."),
which reads as a crash that lost the file; in ``__init__``'s first recovery or a rule it
came out as it was. Now each stops with the ``EscapeError`` explore gives, at the user's line.

``c_read`` (C's fopen through ctypes) stands in for the library, as in
test_faultfs_unseen_read.py: polars and pyarrow are no dev dependencies.
"""

from __future__ import annotations

import inspect
import os

import pytest
from hypothesis.stateful import run_state_machine_as_test

from faultfs.errors import EscapeError, RecoveryCheckFailed
from faultfs.stateful import CrashStateMachine, invariant, rule
from tests.support.faultfs_classic import fsync_dir, machine_settings
from tests.support.pytest_run import run_pytest
from tests.unit.test_faultfs_unseen_read import c_read

WORDS = "t.csv' is on the simulated disk, but the code that raised FileNotFoundError"
READER = "test_faultfs_unseen_read.py:"  # c_read's file: user code, the innermost frame


def write_durably(root: str, text: str) -> None:
    with open(os.path.join(root, "t.csv"), "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    fsync_dir(root)


class CsvStore(CrashStateMachine):
    """A store kept in one CSV file, read back the way a polars user would: by path."""

    profiles = ("posix",)
    modes = ("power",)
    read_in = "check"

    def setup(self) -> None:
        write_durably(self.fs.root, "a\n")

    def recover(self) -> None:
        if self.read_in == "recover":
            c_read(self.fs.path("t.csv"))

    @rule()
    def rewrite(self) -> None:
        with self.acknowledging("b"):
            write_durably(self.fs.root, "b\n")
        if self.read_in == "rule":
            c_read(self.fs.path("t.csv"))

    def check(self) -> None:
        if self.read_in == "check":
            c_read(self.fs.path("t.csv"))


def run(read_in: str) -> EscapeError:
    machine = type(f"CsvStore_{read_in}", (CsvStore,), {"read_in": read_in})
    with pytest.raises(EscapeError) as caught:
        run_state_machine_as_test(machine, settings=machine_settings(20, derandomize=True))
    return caught.value


@pytest.mark.parametrize("read_in", ["recover", "rule", "check"])
def test_a_read_from_c_is_named_at_the_user_s_line(read_in: str) -> None:
    words = str(run(read_in))
    assert WORDS in words
    assert "opened it on the real disk, around Python's os and io" in words
    assert words.startswith(f"{os.path.dirname(__file__)}/{READER}")  # not faultfs's line
    assert "(c_read): '/faultfs-machine/t.csv'" in words


def test_an_invariant_s_read_from_c_is_named() -> None:
    class Watched(CsvStore):
        read_in = "nowhere"

        @invariant()
        def readable(self) -> None:
            c_read(self.fs.path("t.csv"))

    with pytest.raises(EscapeError, match=r"t\.csv' is on the simulated disk"):
        run_state_machine_as_test(Watched, settings=machine_settings(5, derandomize=True))


def test_a_file_really_lost_stays_a_failed_recovery() -> None:
    # The model lacks the file: the crash's doing, which the machine reports as such.
    class Lost(CsvStore):
        read_in = "nowhere"

        def setup(self) -> None:
            pass

        @rule()
        def rewrite(self) -> None:
            with open(self.fs.path("t.csv"), "w") as handle:  # never fsynced
                handle.write("b\n")
            self.ack("b")

        def check(self) -> None:
            if self.acked and not os.path.exists(self.fs.path("t.csv")):
                c_read(self.fs.path("t.csv"))

    with pytest.raises(RecoveryCheckFailed, match="FileNotFoundError"):
        run_state_machine_as_test(Lost, settings=machine_settings(50, derandomize=True))


def test_pytest_shows_the_error_without_faultfs_s_context_manager(tmp_path) -> None:
    # As a contextlib generator, the hand-off's frame printed contextlib's whole __exit__
    # (its "generator didn't stop" branch) above the EscapeError in every such failure.
    source = inspect.getsource(c_read)
    (tmp_path / "test_machine.py").write_text(
        "import ctypes, errno, os\n"
        "from hypothesis import Phase, settings\n"
        "from faultfs.stateful import CrashStateMachine, rule\n"
        "_LIBC = ctypes.CDLL(None, use_errno=True)\n"
        "_LIBC.fopen.restype = ctypes.c_void_p\n"
        "_LIBC.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]\n"
        "_LIBC.fclose.argtypes = [ctypes.c_void_p]\n"
        f"{source}\n"
        "class Reader(CrashStateMachine):\n"
        "    profiles = ('posix',)\n"
        "    def setup(self):\n"
        "        with open(self.fs.path('t.csv'), 'w') as handle:\n"
        "            handle.write('a')\n"
        "    def recover(self):\n"
        "        c_read(self.fs.path('t.csv'))\n"
        "    @rule()\n"
        "    def nothing(self):\n"
        "        pass\n"
        "    def check(self):\n"
        "        pass\n"
        "TestReader = Reader.TestCase\n"
        "TestReader.settings = settings(max_examples=1, database=None, phases=[Phase.generate])\n"
    )
    result = run_pytest(tmp_path, "test_machine.py")
    assert result.returncode == 1, result.stdout
    assert "EscapeError: " in result.stdout and "is on the simulated disk" in result.stdout
    assert "contextlib" not in result.stdout, result.stdout
