"""The throw-away projects of one test process share one Hypothesis constants cache
(tests/support/hypothesis_constants.py) and nothing else of their ``.hypothesis``."""

from __future__ import annotations

from pathlib import Path

from tests.support.ci_project import fake_project
from tests.support.hypothesis_constants import share_constants, shared_constants_dir


def test_fake_projects_of_one_process_share_the_constants_and_keep_their_examples(
    tmp_path: Path,
) -> None:
    first = fake_project(tmp_path / "first", None)
    second = fake_project(tmp_path / "second", None)
    ours = shared_constants_dir()
    assert ours == shared_constants_dir()  # one directory for the whole process
    for project in (first, second):
        assert (project / ".hypothesis" / "constants").resolve() == ours.resolve()
    # what a child of the first wrote, a child of the second reads
    written = first / ".hypothesis" / "constants" / "0123456789abcdef"
    try:
        written.write_text("# file: a module\n")
        assert (second / ".hypothesis" / "constants" / written.name).read_text() == (
            "# file: a module\n"
        )
    finally:
        written.unlink()
    # a bug one project's fuzzer found is not replayed in another's
    (first / ".hypothesis" / "examples").mkdir()
    assert not (second / ".hypothesis" / "examples").exists()


def test_a_given_directory_is_linked_as_it_is(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    link = share_constants(tmp_path / "project", shared)
    assert link == tmp_path / "project" / ".hypothesis" / "constants"
    assert link.is_symlink() and link.resolve() == shared.resolve()
