"""``python -m oracle.mutants`` from an installed substrat (no tests beside it) says so.

It used to run the baseline in the current directory and report pytest's
"unrecognized arguments: --run-stress" as the baseline's failure.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from oracle import mutants


def test_a_directory_without_substrats_tests_is_refused_saying_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(mutants, "default_repo", lambda: tmp_path)
    ran: list[object] = []
    monkeypatch.setattr(mutants, "_run_and_report", lambda *a: ran.append(a) or 0)
    assert mutants.main(["--only", "log_append_no_fsync"]) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert f"{tmp_path} does not hold tests/stress/test_persistence_fuzz.py" in said, said
    assert "run it from a checkout of substrat's source" in said, said
    assert ran == []


def test_list_needs_no_tests(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mutants, "default_repo", lambda: tmp_path)
    assert mutants.main(["--list"]) == 0


def test_a_checkout_goes_on_to_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "tests" / "stress").mkdir(parents=True)
    (tmp_path / "tests" / "stress" / "test_x.py").write_text("")
    monkeypatch.setattr(mutants, "default_repo", lambda: tmp_path)
    ran: list[object] = []
    monkeypatch.setattr(mutants, "_run_and_report", lambda *a: ran.append(a) or 0)
    assert mutants.main(["--only", "log_append_no_fsync", "--tests", "tests/stress"]) == 0
    assert len(ran) == 1
