"""The planted-bug catalog, the systematic mutants and their runner (oracle.mutants).

Every mutant plants cleanly (its snippet occurs exactly once in today's code,
and the planted file compiles); planting never touches the working tree; a
mutant whose snippet is gone is an error, not a pass; and one real end-to-end
run on a tiny test file shows a mutant killed by name, the baseline passing,
and the run using the planted copy rather than the working tree.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

import pytest

from oracle import _mutant_guard, mutant_gen, mutant_report, mutants
from oracle.errors import MutantError
from oracle.mutant_catalog import CATALOG, Mutant, by_name
from tests.support.unused_plugins import PYTEST_ARGS

SOURCE = mutants.RunConfig().source
MIN_CATALOG = 12


@functools.cache
def _sites() -> tuple[mutant_gen.Site, ...]:
    """substrat's systematic mutant sites, found once for this module's tests: finding them
    parses every module of substrat (about half a CPU s), and three tests read them."""
    return tuple(mutant_gen.sites(SOURCE))


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
    # Only the target file differs from the source (the source hashed once, not per file).
    source = _tree_digest(SOURCE)
    changed = {name for name, digest in _tree_digest(package).items() if source.get(name) != digest}
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
    assert "fsync_dir(_parent(target))" in inspect.getsource(persistence)
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
    # the stress gate (--run-stress, which the runner passes) comes from the rootdir conftest
    (repo / "conftest.py").write_text((Path(__file__).parents[2] / "conftest.py").read_text())
    (repo / "tests" / "test_probe.py").write_text(PROBE_TEST)
    config = mutants.RunConfig(
        tests=("tests/test_probe.py",), repo=repo, timeout_s=120, pytest_args=PYTEST_ARGS
    )
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


# -- systematic mutants (oracle.mutant_gen) ---------------------------------------------


def test_systematic_sites_cover_fsyncs_log_writes_and_repair_steps() -> None:
    sites = _sites()
    names = [s.name for s in sites]
    assert len(names) == len(set(names)), "mutant names must be unique"
    for expected in (
        "eventlog.py:EventLog.log:persistence.fsync_fd(self._fd)#1",
        "persistence.py:_atomic_write:fsync_dir#1",
        "persistence.py:durable_create:fsync_dir#1",
        "scheduler.py:TurnScheduler.run:log.log(events.TURN_FAILED)#1",
        "restore.py:apply:host.logs.get().log(events.TURN_FAILED)#1",
        "recovery.py:_cascade_terminate:root.logs.get().log(events.AGENT_TERMINATED)#1",
        "restore.py:apply:inboxes.deliver_data(data)#1",
        "eventlog.py:EventLog._open:os.ftruncate(fd)#1",
    ):
        assert expected in names, expected
    assert {s.kind for s in sites} == {"primitive", "log", "repair"}
    assert not any("session.transition" in n for n in names), "in-memory calls are no sites"


FAKE_MODULE = """\
import os


def keep(fd, log):
    log.log("a.b", {"x": 1})
    seq = log.log("c.d")
    os.fsync(fd)
    return seq
"""


def test_delete_replaces_the_named_call_and_nothing_else(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "recovery.py").write_text(FAKE_MODULE)
    names = [s.name for s in mutant_gen.sites(package)]
    assert names == [
        "recovery.py:keep:log.log#1",
        "recovery.py:keep:log.log#2",
        "recovery.py:keep:os.fsync(fd)#1",
    ]
    for name, planted in (
        (names[0], '    pass\n    seq = log.log("c.d")\n'),
        (names[1], "    seq = 0\n"),  # a used value becomes a neutral one
        (names[2], "    pass\n    return seq\n"),
    ):
        (package / "recovery.py").write_text(FAKE_MODULE)
        mutant_gen.delete(package, name)
        text = (package / "recovery.py").read_text()
        assert planted in text, text
        compile(text, "recovery.py", "exec")
        assert len(text.splitlines()) == len(FAKE_MODULE.splitlines())


def test_mutant_names_survive_code_motion_and_a_gone_call_is_an_error(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "recovery.py").write_text(FAKE_MODULE)
    before = [s.name for s in mutant_gen.sites(package)]
    moved = "def other():\n    return 1\n\n\n" + FAKE_MODULE.replace("\n\n\ndef", "\n\n\n\ndef")
    (package / "recovery.py").write_text(moved)
    assert [s.name for s in mutant_gen.sites(package)] == before
    (package / "recovery.py").write_text(FAKE_MODULE.replace("    os.fsync(fd)\n", ""))
    with pytest.raises(LookupError, match="no such call"):
        mutant_gen.delete(package, "recovery.py:keep:os.fsync(fd)#1")
    site = mutant_gen.Site("recovery.py", "keep", "os.fsync(fd)", 1, "primitive", 1)
    with pytest.raises(MutantError, match="no such call"):
        mutants.plant(site, package, tmp_path / "copy")


def test_every_systematic_mutant_plants_and_compiles(tmp_path: Path) -> None:
    # Each site is planted from a source holding only its file: a deletion reads and
    # writes that file alone, and copying the whole package for each of 100-odd sites
    # was half of this test's CPU (the whole copy is tested above and below).
    sources: dict[str, Path] = {}
    for i, site in enumerate(_sites()):
        if site.file not in sources:
            source = tmp_path / "sources" / str(len(sources)) / mutants.PACKAGE
            (source / site.file).parent.mkdir(parents=True, exist_ok=True)
            (source / site.file).write_bytes((SOURCE / site.file).read_bytes())
            sources[site.file] = source
        package = mutants.plant(site, sources[site.file], tmp_path / str(i))
        path = package / site.file
        compile(path.read_text(encoding="utf-8"), str(path), "exec")
        assert path.read_text(encoding="utf-8") != (SOURCE / site.file).read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("exc_type", "message", "verdict"),
    [
        ("AssertionError", "acknowledged entries lost: log ends at 2, acked 3", "check"),
        ("OracleViolation", "recovered state matches no allowed outcome", "check"),
        ("ExploreFailed", "1 failing image at boundary 3", "check"),
        ("AssertionError", "the crash point was not reached", "harness"),
        ("AssertionError", "assert 3 >= 4\n +  where 3 = <ExploreReport>.boundaries", "harness"),
        ("Failed", "DID NOT RAISE <class 'Crash'>", "harness"),
        ("TypeError", "unsupported operand", "raised"),
        ("FileNotFoundError", "no such file", "raised"),
    ],
)
def test_a_kill_counts_only_when_a_check_fails(exc_type: str, message: str, verdict: str) -> None:
    """A harness assertion is no kill, and neither is the program raising outside a check."""
    assert _mutant_guard.classify(exc_type, message) == verdict


ALLOW_DOC = """\
# x

<!-- allow-list:start -->
| mutant | crash scenario | why nothing is lost |
| --- | --- | --- |
| `a.py:f:fsync#1` | power loss after f | the file is rebuilt from the log |
| `a.py:g:fsync#1` | kill -9 | nothing depends on it |
| `gone.py:h:fsync#1` | any | reason |
<!-- allow-list:end -->
"""


def test_allow_list_marks_reviewed_survivors_and_reports_stale_entries(tmp_path: Path) -> None:
    doc = tmp_path / "mutants.md"
    doc.write_text(ALLOW_DOC)
    allowed = mutant_report.load_allow_list(doc)
    assert allowed["a.py:f:fsync#1"] == "power loss after f the file is rebuilt from the log"
    results = [
        mutant_report.MutantResult("a.py:f:fsync#1", "d", "a.py", mutant_report.SURVIVED),
        mutant_report.MutantResult(
            "a.py:g:fsync#1", "d", "a.py", mutant_report.KILLED, killer="t::x"
        ),
        mutant_report.MutantResult("b.py:k:fsync#1", "d", "b.py", mutant_report.SURVIVED),
    ]
    stale = mutant_report.apply_allow_list(results, allowed)
    assert results[0].status == mutant_report.ALLOWED
    assert stale == ["a.py:g:fsync#1 is allow-listed but was killed by t::x"]
    assert mutant_report.missing_entries([r.name for r in results], allowed) == [
        "gone.py:h:fsync#1 is allow-listed but no such mutant exists"
    ]
    assert mutant_report.exit_status(results, stale) == 1  # b.py survived, a.py:g is stale
    assert mutant_report.exit_status(results[:1]) == 0
    table = mutant_report.markdown(results, 90.0, "systematic mutants")
    assert "1/3 killed by real checks (33%)" in table and "| `b.py:k:fsync#1` | survived" in table
    doc.write_text(ALLOW_DOC.replace("| kill -9 | nothing depends on it |", "|  |  |"))
    with pytest.raises(ValueError, match="gives no reason"):
        mutant_report.load_allow_list(doc)


HARNESS_PROBE = """
import substrat.persistence as persistence


def test_a_harness_check():
    assert persistence.durable_create.__name__ == "durable_create"
    count = 3
    class Report:
        boundaries = count
    assert Report.boundaries >= 4, "the crash point was not reached"
"""


def test_end_to_end_a_systematic_mutant_seen_only_by_a_harness_check(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "tests").mkdir(parents=True)
    (repo / "tests" / "__init__.py").write_text("")
    (repo / "tests" / "test_probe.py").write_text(HARNESS_PROBE)
    # the stress gate (--run-stress, which the runner passes) comes from the rootdir conftest
    (repo / "conftest.py").write_text((Path(__file__).parents[2] / "conftest.py").read_text())
    config = mutants.RunConfig(
        tests=("tests/test_probe.py",), repo=repo, timeout_s=120, pytest_args=PYTEST_ARGS
    )
    site = next(s for s in _sites() if s.name == "persistence.py:durable_create:fsync_dir#1")
    result = mutants.run_mutant(site, config)
    assert result.status == mutants.HARNESS, result.message
    assert "AssertionError" in result.message
