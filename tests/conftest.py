"""Shared fixtures for substrat's own tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A fresh substrat root on the real file system."""
    path = tmp_path / "root"
    path.mkdir()
    return path
