"""An install on a Python older than 3.11 is refused with its reason, whatever the pip.

pip 23.0 (what pyenv's 3.10.13 ships) resolves the ``[dev]`` extra before it
checks ``requires-python``: the README's ``pip install -e '.[dev]'`` on 3.10
ended with "No matching distribution found for zizmor>=1.32" and never named
the Python. pyproject.toml now names an in-tree backend
(``build_backend/substrat_build.py``) that pip imports in the target Python
before it resolves anything; it refuses an old one and is setuptools'
backend otherwise.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BACKEND_DIR = ROOT / "build_backend"


def _pyproject() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as handle:
        return tomllib.load(handle)


def _import_backend(python: str, prelude: str = "") -> subprocess.CompletedProcess[str]:
    code = f"{prelude}import sys; sys.path.insert(0, {str(BACKEND_DIR)!r}); import substrat_build"
    return subprocess.run([python, "-I", "-c", code], capture_output=True, text=True, timeout=120)


def test_pyproject_builds_through_the_checking_backend() -> None:
    build = _pyproject()["build-system"]
    assert build["build-backend"] == "substrat_build"
    assert build["backend-path"] == ["build_backend"]
    assert (BACKEND_DIR / "substrat_build.py").is_file()
    # an sdist must carry the backend, or a wheel built from it finds none
    manifest = (ROOT / "MANIFEST.in").read_text(encoding="utf-8").splitlines()
    assert "include build_backend/substrat_build.py" in manifest


def test_on_a_supported_python_it_is_setuptools_backend() -> None:
    probe = (
        f"import sys; sys.path.insert(0, {str(BACKEND_DIR)!r}); "
        "import substrat_build, setuptools.build_meta as m; "
        "names = ['build_wheel', 'build_sdist', 'build_editable', "
        "'prepare_metadata_for_build_editable', 'get_requires_for_build_editable']; "
        "print(all(getattr(substrat_build, n) is getattr(m, n) for n in names))"
    )
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "True"


def test_an_older_python_is_refused_with_its_version() -> None:
    # this interpreter, told it is 3.10: the check reads sys.version_info and nothing else
    run = _import_backend(
        sys.executable, "import sys; sys.version_info = (3, 10, 13, 'final', 0); "
    )
    assert run.returncode == 1
    assert "substrat needs Python 3.11 or newer" in run.stderr
    assert sys.executable in run.stderr


def _older_pythons() -> list[str]:
    roots = {os.environ.get("PYENV_ROOT", ""), os.path.expanduser("~/.pyenv")} - {""}
    found = [
        p for r in roots for p in glob.glob(os.path.join(r, "versions", "3.*", "bin", "python3"))
    ]
    found += [f"/usr/bin/python3.{minor}" for minor in range(6, 11)]
    older = []
    for python in sorted(set(found)):
        if not os.access(python, os.X_OK):
            continue
        ask = subprocess.run(
            [python, "-c", "import sys; print(sys.version_info < (3, 11))"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if ask.stdout.strip() == "True":
            older.append(python)
    return older


def test_a_real_older_python_is_refused_before_anything_else() -> None:
    older = _older_pythons()
    if not older:
        pytest.skip("no Python older than 3.11 on this machine (pyenv versions, /usr/bin) to try")
    for python in older:
        run = _import_backend(python)
        assert run.returncode == 1, (python, run.stdout, run.stderr)
        assert "substrat needs Python 3.11 or newer; this is Python 3." in run.stderr, run.stderr
