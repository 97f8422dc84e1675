"""A planted durability bug: what :mod:`oracle.mutant_catalog` lists and
:mod:`oracle.mutants` plants (its own module, so that each part of the catalog can
name it without importing the whole)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    """One planted bug: replace ``old`` (exactly one occurrence) by ``new`` in ``file``."""

    name: str
    description: str
    file: str
    old: str
    new: str

    def __post_init__(self) -> None:
        assert self.old and self.old != self.new, f"mutant {self.name} changes nothing"
        assert not self.file.startswith("/") and ".." not in self.file, self.file
