"""The README is the entry page and the guides in docs/ hold the rest: the README's two commands
exist, every guide is linked from it, and every relative link (a file, an image, a heading)
between the README and the guides leads somewhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cairn.config import REPO

README = REPO / "README.md"
GUIDES = sorted((REPO / "docs").glob("*.md"))
PAGES = [README, *GUIDES]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def unfenced(page: Path) -> str:
    """The page without its fenced code blocks."""
    return re.sub(r"^```.*?^```", "", page.read_text(), flags=re.DOTALL | re.MULTILINE)


def prose(page: Path) -> str:
    """The page without its code: no fenced blocks, no inline code."""
    return re.sub(r"`[^`\n]*`", "", unfenced(page))


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the page's headings (a repeated one gets -1, -2 …)."""
    found: set[str] = set()
    for line in unfenced(page).splitlines():
        heading = re.match(r"#{1,6} (.*)", line)
        if heading is None:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
        n, unique = 0, slug
        while unique in found:
            n += 1
            unique = f"{slug}-{n}"
        found.add(unique)
    return found


def links(page: Path) -> list[str]:
    """The page's relative links (not web addresses, not mail)."""
    return [t for t in LINK.findall(prose(page)) if not re.match(r"[a-z]+:", t)]


def test_there_are_guides_and_links_to_check() -> None:
    assert len(GUIDES) >= 5
    assert all(links(page) for page in PAGES)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_link_leads_to_a_file_and_a_heading(page: Path) -> None:
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and (linked.suffix != ".md" or anchor not in anchors(linked)):
            broken.append(f"{target}: no such heading")
    assert not broken, f"{page.relative_to(REPO)}: {broken}"


def test_the_readme_links_every_guide() -> None:
    linked = {(REPO / t.partition("#")[0]).resolve() for t in links(README)}
    assert set(GUIDES) <= linked


def test_the_readme_starts_with_its_two_commands_and_the_makefile_has_them() -> None:
    quick_start = README.read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"^make (\w+)", quick_start, flags=re.MULTILINE)
    assert commands == ["demo", "test"]
    targets = re.findall(r"^(\w+):", (REPO / "Makefile").read_text(), flags=re.MULTILINE)
    assert {"demo", "test"} <= set(targets)
