"""A kill -9 of an in-process orchestrator, as the tests simulate it (see oracle.kill)."""

from __future__ import annotations

from oracle.kill import abandon

__all__ = ["abandon"]
