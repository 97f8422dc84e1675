"""What ``substrat fsck`` reports: its findings, their severities, the exit codes."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from substrat.session.store import AGENTS_DIR

EXIT_CLEAN = 0
EXIT_DAMAGE = 1
EXIT_ERROR = 2
DAMAGE, LEFTOVER, NOTICE = "damage", "leftover", "notice"


@dataclass
class Finding:
    """One thing fsck found: what, where (relative to the root), how bad, and the fix."""

    kind: str
    path: str
    severity: str
    detail: str
    count: int = 1
    repair: str | None = None
    """What --repair does about it (None: nothing to do, or nothing fsck can do)."""
    repaired: bool = False
    agent: str | None = None
    """The path of the agent whose files these are (``lead/scout``), when known."""

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class FsckReport:
    root: str
    repair: bool
    findings: list[Finding] = field(default_factory=list)
    sessions: int = 0
    logs: int = 0
    entries: int = 0
    recovery: dict[str, Any] | None = None
    """With ``repair``: the report of the recovery run at the end."""
    agents: dict[str, str] = field(default_factory=dict)
    """Session id -> agent path (``lead/scout``), so findings can name their agent."""
    agent_paths: dict[str, str] = field(default_factory=dict)
    """Agent id -> agent path, so the repair's recovery lines name agents as a start's do."""
    acknowledged: list[dict[str, Any]] = field(default_factory=list)
    """With ``acknowledge``: the incidents acknowledged before the check (substrat.incidents)."""

    def add(
        self,
        kind: str,
        path: Path | str,
        severity: str,
        detail: str,
        *,
        count: int = 1,
        repair: str | None = None,
    ) -> None:
        rel = os.path.relpath(path, self.root) if os.path.isabs(path) else str(path)
        self.findings.append(Finding(kind, rel, severity, detail, count, repair))

    @property
    def problems(self) -> list[Finding]:
        return [f for f in self.findings if f.severity != NOTICE]

    def name_agents(self) -> None:
        """Name each finding's agent from the session id in its path."""
        for finding in self.findings:
            parts = Path(finding.path).parts
            if len(parts) >= 2 and parts[0] == AGENTS_DIR:
                finding.agent = self.agents.get(parts[1])

    def kinds(self, *, include_notices: bool = False) -> dict[str, int]:
        """Count of findings per kind (weighted by ``count``)."""
        tally: dict[str, int] = {}
        for f in self.findings:
            if include_notices or f.severity != NOTICE:
                tally[f.kind] = tally.get(f.kind, 0) + f.count
        return tally

    @property
    def exit_code(self) -> int:
        return EXIT_DAMAGE if self.problems else EXIT_CLEAN

    def to_dict(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "repair": self.repair,
            "exit_code": self.exit_code,
            "clean": not self.problems,
            "sessions": self.sessions,
            "logs": self.logs,
            "entries": self.entries,
            "findings": [f.to_dict() for f in self.findings],
            "recovery": self.recovery,
            "agents": dict(self.agents),
            "acknowledged": list(self.acknowledged),
        }
