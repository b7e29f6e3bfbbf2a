"""The Markdown pages: every relative link resolves to a file in the repository, nothing points
outside it, and the README stays a short manual for users (at most 300 lines, no commit hashes)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([*ROOT.glob("*.md"), *(ROOT / "docs").glob("*.md")])
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
"""The target of an inline Markdown link or image: ``[text](target "title")``."""
UP_PATH = re.compile(r"(?:\.\./)+[\w.\-/]*")
"""A path that climbs (``../x``), in a link or in plain text: it must stay inside the repository."""
COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
"""A commit hash, short or full: 7-40 hex digits with at least one letter and one digit (so that
numbers such as dates and plain words such as "deface" do not count)."""
README_MAX_LINES = 300


def relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


def inside(path: Path) -> bool:
    return path.resolve().is_relative_to(ROOT)


def test_the_pages_are_found():
    names = {relative(p) for p in PAGES}
    top = {"README.md", "ARCHITECTURE.md", "CONTRIBUTING.md", "CHANGELOG.md"}
    assert top | {"docs/benchmarks.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=relative)
def test_links_resolve_to_files_in_the_repository(page: Path):
    text = page.read_text(encoding="utf-8")
    bad = []
    for target in LINK.findall(text):
        if target.startswith("#"):
            continue  # a heading on the same page
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            bad.append(f"{target} (a link outside the repository)")
            continue
        path = (page.parent / target.split("#", 1)[0]).resolve()
        if not inside(path):
            bad.append(f"{target} (outside the repository)")
        elif not path.exists():
            bad.append(f"{target} (no such file)")
    assert not bad, f"{relative(page)}: {bad}"


@pytest.mark.parametrize("page", PAGES, ids=relative)
def test_nothing_points_outside_the_repository(page: Path):
    text = page.read_text(encoding="utf-8")
    urls = re.findall(r"https?://\S+", text)
    climbs = [p for p in UP_PATH.findall(text) if not inside(page.parent / p)]
    assert not urls and not climbs, f"{relative(page)}: {urls + climbs}"


def test_readme_is_short_and_has_no_commit_hashes():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md: {len(lines)} lines, over {README_MAX_LINES}"
    hashes = [(n, m) for n, line in enumerate(lines, 1) for m in COMMIT.findall(line)]
    assert not hashes, f"README.md names commits (line, hash): {hashes}"


@pytest.mark.parametrize(
    "text, found",
    [
        ("fixed at 6d6eaec", ["6d6eaec"]),
        ("at e9cee6d7fbe024400671a8a6691f3608e1bc8e37", ["e9cee6d7fbe024400671a8a6691f3608e1bc8e37"]),
        ("runs/grpo_arith-20261124-211142", []),  # a date and a time: digits only
        ("a defaced facade", []),  # words: letters only
        ("0x1f or abc123", []),  # too short
    ],
)
def test_commit_pattern(text: str, found: list[str]):
    assert COMMIT.findall(text) == found
