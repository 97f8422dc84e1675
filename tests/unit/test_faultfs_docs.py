"""docs/faultfs.md's quickstart is true: its code, run as shown, prints the report it shows.

The first Python block of the quickstart is written to ``test_save.py`` in a
scratch project and run by pytest in a child process; the header and every
cause, fix and step line of the report the docs print must appear verbatim.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.pytest_run import run_pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "faultfs.md"
CHILD_TIMEOUT_S = 120


def _quickstart() -> tuple[str, list[str]]:
    text = DOC.read_text()
    section = text[text.index("## Quickstart") : text.index("## Using faultfs on your own project")]
    code = re.findall(r"```python\n(.*?)```", section, re.S)[0]
    shown = re.findall(r"```\n(faultfs explore:.*?)```", section, re.S)[0]
    # The lines that do not depend on the check's assertion rewriting: the
    # header, each cause, its fix and its steps.
    lines = [
        line.rstrip()
        for line in shown.splitlines()
        if not line.lstrip().startswith(("error:", "e.g.", "image:"))
    ]
    return code, [line for line in lines if line.strip()]


def test_the_quickstart_prints_the_report_the_docs_show(tmp_path: Path) -> None:
    code, shown = _quickstart()
    (tmp_path / "test_save.py").write_text(code)
    result = run_pytest(tmp_path, "test_save.py", timeout_s=CHILD_TIMEOUT_S)
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    printed = {line.rstrip() for line in out.splitlines()}
    missing = [line for line in shown if line not in printed]
    assert not missing, f"docs show lines the run did not print: {missing}\n{out}"
