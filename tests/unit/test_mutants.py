"""The planted-bug catalog and its runner (oracle.mutants).

Every mutant plants cleanly (its snippet occurs exactly once in today's code,
and the planted file compiles); planting never touches the working tree; a
mutant whose snippet is gone is an error, not a pass; and one real end-to-end
run on a tiny test file shows a mutant killed by name, the baseline passing,
and the run using the planted copy rather than the working tree.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from oracle import mutants
from oracle.errors import MutantError
from oracle.mutant_catalog import CATALOG, Mutant, by_name

SOURCE = mutants.RunConfig().source
MIN_CATALOG = 12


def _tree_digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*.py"))
    }


def test_catalog_is_big_and_uniquely_named() -> None:
    assert len(CATALOG) >= MIN_CATALOG
    assert len(by_name()) == len(CATALOG)
    assert all(m.description and m.file.endswith(".py") for m in CATALOG)


@pytest.mark.parametrize("mutant", CATALOG, ids=[m.name for m in CATALOG])
def test_every_mutant_plants_exactly_once_and_compiles(mutant: Mutant, tmp_path: Path) -> None:
    original = (SOURCE / mutant.file).read_text(encoding="utf-8")
    assert original.count(mutant.old) == 1, f"{mutant.name}: snippet must occur exactly once"
    package = mutants.plant(mutant, SOURCE, tmp_path)
    planted = (package / mutant.file).read_text(encoding="utf-8")
    assert planted == original.replace(mutant.old, mutant.new)
    assert planted != original
    compile(planted, str(package / mutant.file), "exec")
    # Only the target file differs from the source.
    changed = {
        name
        for name, digest in _tree_digest(package).items()
        if _tree_digest(SOURCE).get(name) != digest
    }
    assert changed == {mutant.file}


def test_check_catalog_reports_no_problems_today() -> None:
    assert mutants.check_catalog(CATALOG, SOURCE) == {}


def test_planting_never_touches_the_working_tree(tmp_path: Path) -> None:
    before = _tree_digest(SOURCE)
    for i, mutant in enumerate(CATALOG):
        package = mutants.plant(mutant, SOURCE, tmp_path / str(i))
        assert package.is_relative_to(tmp_path)
    assert _tree_digest(SOURCE) == before


def test_planting_into_the_source_is_refused(tmp_path: Path) -> None:
    with pytest.raises(MutantError, match="overlaps"):
        mutants.plant(CATALOG[0], SOURCE, SOURCE / "sub")
    with pytest.raises(MutantError, match="overlaps"):
        mutants.plant(CATALOG[0], SOURCE, SOURCE.parent)


def _fake_package(root: Path) -> Path:
    source = root / "src" / "substrat"
    source.mkdir(parents=True)
    (source / "__init__.py").write_text("")
    (source / "core.py").write_text("def f():\n    return 1\n\n\ndef g():\n    return 1\n")
    return source


def test_missing_or_ambiguous_snippet_is_an_error(tmp_path: Path) -> None:
    source = _fake_package(tmp_path)
    gone = Mutant("gone", "snippet removed by a refactor", "core.py", "return 2\n", "return 3\n")
    twice = Mutant("twice", "snippet matches twice", "core.py", "return 1\n", "return 0\n")
    nofile = Mutant("nofile", "file removed", "old.py", "x", "y")
    with pytest.raises(MutantError, match="occurs 0 times"):
        mutants.plant(gone, source, tmp_path / "a")
    with pytest.raises(MutantError, match="occurs 2 times"):
        mutants.plant(twice, source, tmp_path / "b")
    with pytest.raises(MutantError, match="does not exist"):
        mutants.plant(nofile, source, tmp_path / "c")
    problems = mutants.check_catalog([gone, twice, nofile], source)
    assert sorted(problems) == ["gone", "nofile", "twice"]


def test_runner_reports_a_missing_snippet_as_an_error_without_running(tmp_path: Path) -> None:
    gone = Mutant("gone", "snippet removed by a refactor", "persistence.py", "no such code\n", "x")
    config = mutants.RunConfig(tests=("does/not/matter.py",), repo=tmp_path, timeout_s=5)
    result = mutants.run_mutant(gone, config)
    assert result.status == mutants.ERROR
    assert "occurs 0 times" in result.message
    assert mutants.exit_status([result]) == 2


def test_exit_status() -> None:
    def r(status: str) -> mutants.MutantResult:
        return mutants.MutantResult("m", "d", "f.py", status)

    assert mutants.exit_status([r(mutants.KILLED)] * 3) == 0
    assert mutants.exit_status([r(mutants.KILLED), r(mutants.SURVIVED)]) == 1
    assert mutants.exit_status([r(mutants.KILLED), r(mutants.TIMEOUT)]) == 1
    assert mutants.exit_status([r(mutants.KILLED), r(mutants.ERROR)]) == 2


# -- one real run, on a tiny test file instead of the stress suite --------------------

PROBE_TEST = """
import inspect
import substrat.persistence as persistence


def test_unrelated():
    assert True


def test_atomic_write_fsyncs_its_directory():
    assert "fsync_dir(target.parent)" in inspect.getsource(persistence)
"""


def test_end_to_end_kill_survive_and_isolation(tmp_path: Path) -> None:
    # Laid out like this repository: a tests package with a conftest (loading it puts
    # the repository root first on sys.path) next to a substrat package that must
    # not be the one under test.
    repo = tmp_path / "repo"
    (repo / "tests").mkdir(parents=True)
    (repo / "substrat").mkdir()
    (repo / "substrat" / "__init__.py").write_text("raise ImportError('the working tree')\n")
    (repo / "tests" / "__init__.py").write_text("")
    (repo / "tests" / "conftest.py").write_text("")
    (repo / "tests" / "test_probe.py").write_text(PROBE_TEST)
    config = mutants.RunConfig(tests=("tests/test_probe.py",), repo=repo, timeout_s=120)
    before = _tree_digest(SOURCE)
    killed = mutants.run_mutant(by_name()["atomic_write_no_dir_fsync"], config)
    assert killed.status == mutants.KILLED, killed.message
    assert killed.killer == "tests/test_probe.py::test_atomic_write_fsyncs_its_directory"
    survivor = mutants.run_mutant(by_name()["unlink_no_dir_fsync"], config)
    assert survivor.status == mutants.SURVIVED, survivor.message
    assert mutants.exit_status([killed, survivor]) == 1
    assert _tree_digest(SOURCE) == before


def test_cli_list_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert mutants.main(["--list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [m["name"] for m in listed] == [m.name for m in CATALOG]
    assert mutants.main(["--only", "no-such-mutant"]) == 2
