"""``python -m oracle.bench`` outside a checkout: the rows that need the repository's
``tests/`` are skipped with a reason, not a ModuleNotFoundError."""

from __future__ import annotations

import pytest

from oracle import bench_fuzz


def test_without_the_repositorys_tests_the_openai_row_is_skipped_with_a_reason(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(bench_fuzz, "_repository_tests", lambda: False)
    # the CLI row's real measure spawns processes; its figure is not under test here
    monkeypatch.setattr(bench_fuzz, "cli_commands", lambda: 5.0)
    monkeypatch.setattr(bench_fuzz, "openai_examples", lambda: pytest.fail("not skipped"))
    rows = bench_fuzz.campaign_rows(None, rounds=1)
    assert [r.measure for r in rows] == [
        "CLI: `substrat agent list --json` processes/s (CPU, median of 5)"
    ]
    assert "run it from a checkout of substrat" in capsys.readouterr().err


def test_in_a_checkout_the_repositorys_tests_are_found() -> None:
    assert bench_fuzz._repository_tests()
