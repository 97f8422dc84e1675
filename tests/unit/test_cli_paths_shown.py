"""Paths a user gets wrong (s28c, after the outsider's seat of s27d).

* A root path holding a newline, a tab, ESC or a carriage return was printed raw: every
  message naming it split across lines (or recoloured the terminal), and the commands it
  suggested spanned two lines. Such a path is now written as bash's ``$'...'`` word, on
  one line (:func:`substrat.shellword.shown`); an ordinary path is printed as before.
* ``--root ../x`` was printed as ``/cwd/../x`` in some lines; worse, ``sub/link/../x``
  (``link`` a symlink) was made by ``mkdir -p`` lexically, at ``sub/x``, while the kernel
  (and everything after) took ``x`` beside the link's target, and ``nope/../x`` made ``x``
  although ``nope`` does not exist. ``..`` is now resolved as the kernel does, once.
* A path under a symlink to nothing: a command that reads suggested the ``daemon start``
  that then failed with a bare "File exists".

Real directories with those names, the commands run in process (no daemon is started).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from substrat.cli import main
from substrat.cli.common import esc
from substrat.errors import RootUnusableError
from substrat.rootdir import prepare_root
from substrat.shellword import shell_word, shown
from tests.support import mounts

ODD = {
    "newline": "a\nb",
    "tab": "a\tb",
    "esc": "a\x1b[31mred",
    "cr": "over\rwrite",
    "quote-backslash": "it's\\n\n",
    "not-utf8": os.fsdecode(b"caf\xe9\n"),
    "nbsp": "a\xa0b\n",
    "line-separator": "a\u2028b",
}


def _run(*args: str, cwd: Path | None = None) -> Result:
    old = os.getcwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        return CliRunner().invoke(main, list(args), prog_name="substrat")
    finally:
        os.chdir(old)


def _one_line(result: Result) -> str:
    """The output, which must be one line of printable text."""
    assert result.output.endswith("\n") and result.output.count("\n") == 1, repr(result.output)
    line = result.output[:-1]
    assert line.isprintable(), repr(line)
    return line


@pytest.mark.skipif(shutil.which("bash") is None, reason="reads the words back with bash")
@pytest.mark.parametrize("name", ODD.values(), ids=ODD.keys())
def test_a_path_that_does_not_print_is_one_word_bash_reads_back(name: str) -> None:
    path = f"/srv/{name}/r"
    for word in (shown(path), shell_word(path)):
        assert word.startswith("$'") and word.isprintable(), word
        back = subprocess.run(
            ["bash", "-c", f"printf %s {word}"], capture_output=True, check=True
        ).stdout
        assert back == os.fsencode(path), (word, back)


def test_an_ordinary_path_is_printed_as_it_always_was() -> None:
    for path in ("/tmp/pytest-of-root/x_1.2/root", "/srv/my roots/é", "/srv/it's"):
        assert shown(path) == path
    assert shell_word("/srv/my roots/r") == "'/srv/my roots/r'"


def test_a_blank_at_either_end_is_shown_in_quotes() -> None:
    """A space pasted after a path ends the line that says a new root was made there
    (``created a new root at /srv/r ``), where nobody sees it."""
    assert shown("/srv/r ") == "'/srv/r '" and shown(" /srv/r") == "' /srv/r'"
    assert esc(Path("/srv/my r ")) == "'/srv/my r '"


@pytest.mark.parametrize("name", ODD.values(), ids=ODD.keys())
def test_a_missing_root_with_such_a_name_is_named_on_one_line(tmp_path: Path, name: str) -> None:
    root = tmp_path / name / "r"
    line = _one_line(_run("agent", "list", "--no-autostart", "--root", str(root)))
    assert line.startswith(f"error: no substrat root at {shown(root)} (nothing is there)"), line
    assert f"`substrat daemon start --root {shell_word(root)}`" in line, line
    assert not (tmp_path / name).exists()


def test_every_refusal_names_such_a_path_on_one_line(tmp_path: Path) -> None:
    odd = tmp_path / "x\ny\x1b"
    odd.mkdir()
    (odd / "f").write_text("")
    outer = prepare_root(odd / "outer")
    nowhere = odd / "nowhere\n"
    (odd / "gone\n").symlink_to(nowhere)
    cases = {
        ("daemon", "start", "--root", str(odd / "f")): f"cannot use {shown(odd / 'f')} as",
        ("daemon", "start", "--root", str(outer / "agents" / "x")): (
            f"it is inside the substrat root {shown(outer)} (under its agents/)"
        ),
        ("fsck", "--root", str(odd / "gone\n")): f"a symlink to {shown(nowhere)},",
        ("agent", "list", "--root", str(odd)): f"{shown(odd)} is not a substrat root",
        ("daemon", "start", "--root", str(odd / "nope" / ".." / "r")): (
            f"the path up to its last `..` ({shown(odd / 'nope' / '..')}) cannot be followed"
        ),
    }
    for args, said in cases.items():
        result = _run(*args)
        assert result.exit_code == 2, result.output
        assert said in _one_line(result), (args, result.output)
    assert sorted(os.listdir(odd)) == ["f", "gone\n", "outer"]
    assert sorted(os.listdir(outer)) == ["substrat-root.json"]


def test_a_root_with_such_a_name_is_named_on_one_line_by_what_reads_it(tmp_path: Path) -> None:
    root = prepare_root(tmp_path / "r\nx")
    status = _run("daemon", "status", "--root", str(root))
    assert status.exit_code == 3, status.output
    assert status.output.splitlines()[0] == f"no daemon running on {shown(root)}", status.output
    fsck = _run("fsck", "--root", str(root))
    assert fsck.exit_code == 0, fsck.output
    assert fsck.output.startswith(f"fsck {shown(root)}: 0 sessions"), fsck.output
    result = _run("agent", "list", "--no-autostart", "--root", str(root))
    assert result.exit_code == 3, result.output
    assert f"no daemon is running for root {shown(root)} (no socket at" in _one_line(result)


def test_dot_dot_is_taken_as_the_kernel_takes_it(tmp_path: Path) -> None:
    (tmp_path / "w" / "sub").mkdir(parents=True)
    (tmp_path / "other" / "deep").mkdir(parents=True)
    (tmp_path / "w" / "sub" / "link").symlink_to(tmp_path / "other" / "deep")
    made = prepare_root(tmp_path / "w" / "sub" / "link" / ".." / "x")
    assert made == tmp_path / "other" / "x"
    assert (made / "substrat-root.json").is_file()
    assert not (tmp_path / "w" / "sub" / "x").exists()
    with pytest.raises(RootUnusableError, match="cannot be followed"):
        prepare_root(tmp_path / "nope" / ".." / "y")
    assert not (tmp_path / "y").exists() and not (tmp_path / "nope").exists()


def test_a_relative_root_with_dot_dot_is_printed_absolute(tmp_path: Path) -> None:
    root = prepare_root(tmp_path / "x")
    (tmp_path / "sub").mkdir()
    result = _run("agent", "list", "--no-autostart", "--root", "../x", cwd=tmp_path / "sub")
    assert result.exit_code == 3, result.output
    assert f"no daemon is running for root {root} (no socket at {root}/daemon.sock)" in (
        _one_line(result)
    )
    assert ".." not in result.output


def test_a_path_under_a_symlink_to_nothing_says_so(tmp_path: Path) -> None:
    (tmp_path / "link").symlink_to(tmp_path / "data")
    for args in (("agent", "list"), ("daemon", "start"), ("agent", "create", "lead")):
        result = _run(*args, "--root", str(tmp_path / "link" / "x"))
        assert result.exit_code == 2, result.output
        line = _one_line(result)
        assert f"{tmp_path / 'link'} is a symlink to {tmp_path / 'data'}, which does" in line
        assert f"`mkdir -m 700 {tmp_path / 'data'}`" in line and "File exists" not in line
        assert "creates one" not in line, line
    assert sorted(os.listdir(tmp_path)) == ["link"]


def test_a_path_inside_a_root_names_that_root(tmp_path: Path) -> None:
    """``--root R/agents`` (or a mistyped ``R/user``) for a command that only reads: the
    root it is in, not "`daemon start` creates one", which would refuse it as nested."""
    outer = prepare_root(tmp_path / "r")
    (outer / "agents" / "0123").mkdir(parents=True)
    for under, args in (("agents", ("agent", "list")), ("user", ("compact",)), ("x", ("fsck",))):
        result = _run(*args, "--root", str(outer / under))
        assert result.exit_code == 2, result.output
        assert _one_line(result) == (
            f"error: no substrat root at {outer / under}: it is inside the substrat root "
            f"{outer} (under its {under}/); use `--root {outer}` for that root, or pick a path "
            "outside it for a new one"
        )
    assert sorted(os.listdir(outer)) == ["agents", "substrat-root.json"]


def test_a_tilde_naming_no_user_is_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--root '~nosuchuser/x'`` (a mistyped ``~/x``) was a traceback (pathlib's "Could
    not determine home directory"), and so was the default root without a home."""
    monkeypatch.delenv("SUBSTRAT_HOME", raising=False)
    for args in (("agent", "list", "--root"), ("daemon", "start", "--root"), ("--root",)):
        result = _run(*args, "~nosuchuser-s28c/x", *(("agent", "list") if len(args) == 1 else ()))
        assert result.exit_code == 2, result.output
        assert (
            "~nosuchuser-s28c names no home directory (no such user, or HOME is unset); write "
            "'./~nosuchuser-s28c/x' for a directory named ~nosuchuser-s28c here"
        ) in result.output, result.output
    import pwd

    def no_entry(uid: int) -> pwd.struct_passwd:
        raise KeyError(uid)

    monkeypatch.delenv("HOME")
    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    result = _run("daemon", "start", cwd=tmp_path)
    assert result.exit_code == 2, result.output
    assert "no home directory for the default root ~/.substrat" in result.output
    assert os.listdir(tmp_path) == []


def test_a_symlink_loop_or_a_name_too_long_says_so(tmp_path: Path) -> None:
    """These said "Too many levels of symbolic links" or "File name too long", then "pick a
    directory you can write", which is not what is wrong."""
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    long_name = tmp_path / ("n" * 256)
    long_path = tmp_path.joinpath(*["p" * 200] * 21)
    cases = {
        tmp_path / "a": "its symlinks point at each other in a loop (see `ls -l` of them); use "
        "--root or SUBSTRAT_HOME to give a path without the loop",
        tmp_path / "a" / "x": "in a loop",
        long_name: "a name in it is longer than its file system allows (255 bytes?); use "
        "--root or SUBSTRAT_HOME to give a shorter path",
        long_path: "the path is longer than the system allows (PATH_MAX); use --root or "
        "SUBSTRAT_HOME to give a shorter path",
    }
    for path, said in cases.items():
        for args in (("agent", "list"), ("daemon", "start")):
            result = _run(*args, "--root", str(path))
            assert result.exit_code == 2, result.output
            assert said in _one_line(result), result.output
    assert sorted(os.listdir(tmp_path)) == ["a", "b"]


def test_the_commands_a_read_only_root_is_told_to_run_name_it(tmp_path: Path) -> None:
    """ "`substrat recover --dry-run` and `substrat fsck` read it as it is": run as told by a
    user of `--root R`, they read the default root, not R."""
    with mounts.tmpfs(tmp_path / "mnt", "1m", "to make read-only") as mount_point:
        root = prepare_root(mount_point / "my r")
        remount = subprocess.run(
            ["mount", "-o", "remount,ro", str(mount_point)], capture_output=True, text=True
        )
        assert remount.returncode == 0, remount.stderr
        result = _run("daemon", "start", "--root", str(root))
        assert result.exit_code == 2, result.output
        assert (
            f"(`substrat recover --dry-run --root {shell_word(root)}` and `substrat fsck "
            f"--root {shell_word(root)}` read it as it is)"
        ) in _one_line(result)


def test_a_bad_substrat_home_is_named_as_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bad $SUBSTRAT_HOME was reported as "Invalid value for '--root'", an option the
    user never gave; a bad --root still is."""
    monkeypatch.setenv("SUBSTRAT_HOME", "~nosuchuser-s28/x")
    from_env = _run("agent", "list")
    assert from_env.exit_code == 2, from_env.output
    said = " ".join(from_env.output.split())
    assert "Invalid value for $SUBSTRAT_HOME: ~nosuchuser-s28 names no home directory" in said
    assert "'--root'" not in said
    given = _run("agent", "list", "--root", "~nosuchuser-s28/x")
    assert "Invalid value for '--root': ~nosuchuser-s28" in " ".join(given.output.split())
