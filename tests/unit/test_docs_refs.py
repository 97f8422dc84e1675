"""The project's own docs point at things that exist and name what users meet."""

from __future__ import annotations

import re
from pathlib import Path

from substrat.daemon import build_registry

REPO = Path(__file__).parents[2]
DOCS = sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md"]
MARKDOWN_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
BARE_DOC = re.compile(r"\b([A-Z][A-Z_]+\.md)\b")


def test_every_linked_or_cited_document_is_in_the_project() -> None:
    missing = []
    for doc in DOCS:
        text = doc.read_text()
        for target in MARKDOWN_LINK.findall(text):
            if "://" in target:
                continue
            if not (doc.parent / target).exists():
                missing.append(f"{doc.name}: link to {target}")
        for name in BARE_DOC.findall(text):  # "see DESIGN.md" with no link
            if not list(REPO.glob(f"**/{name}")):
                missing.append(f"{doc.name}: cites {name}")
    assert missing == []


def test_the_readme_names_every_provider_the_daemon_offers() -> None:
    readme = (REPO / "README.md").read_text()
    section = readme[
        readme.index("<!-- providers:start -->") : readme.index("<!-- providers:end -->")
    ]
    for name in build_registry().names():
        assert f"**`{name}`**" in section, name
