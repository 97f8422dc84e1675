"""`-p oracle.pytest_plugin` in a project without Hypothesis says what to install (review s27d).

Installing substrat does not install Hypothesis (a dev dependency); the README says the
plugin needs it. Loaded without it, pytest printed only "ModuleNotFoundError: No module
named 'hypothesis'" from the plugin's import line, where faultfs.stateful says what it is
and `pip install hypothesis`. The child blocks Hypothesis's import, as a venv without it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]

BLOCKED = """
import sys

class NoHypothesis:
    def find_spec(self, name, path=None, target=None):
        if name == "hypothesis" or name.startswith("hypothesis."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoHypothesis())
try:
    import oracle.pytest_plugin
except ImportError as exc:
    print(exc)
"""


def test_the_plugin_without_hypothesis_says_to_install_it() -> None:
    child = subprocess.run(
        [sys.executable, "-c", BLOCKED], capture_output=True, text=True, timeout=120, cwd=CHECKOUT
    )
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == (
        "oracle.pytest_plugin (substrat's --run-stress gate and Hypothesis profiles) builds "
        "on Hypothesis, which is not installed: pip install hypothesis"
    ), child.stdout + child.stderr
