"""The product's docs stand alone: every relative link resolves inside the repository,
and nothing in it names or links the team's internal notes kept outside it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from urllib.parse import unquote

from tests.support import REPO

# The team's own notes live in a folder beside the repository, never in it: the product
# may not name them or link there (what they teach belongs in docs/, in our own words).
OUTSIDE = re.compile(
    rb"BACKGROUND\.md|DESIGN\.md|STYLE\.md|(?:\.\./)+shared(?![\w.-])|/work/shared(?![\w.-])"
)
_SKIP_DIRS = {".git", ".venv", "node_modules", "__pycache__", ".mypy_cache", ".ruff_cache"}

_FENCE = re.compile(r"^\s*(```|~~~)")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
_INLINE_LINK = re.compile(
    r"\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)"
)
_REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def repo_files() -> list[Path]:
    """Tracked files and new files git does not ignore; every file when git is absent."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO,
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
        paths = {REPO / p for p in out.decode().split("\0") if p}
    except (OSError, subprocess.CalledProcessError):
        paths = {
            p for p in REPO.rglob("*") if not _SKIP_DIRS.intersection(p.relative_to(REPO).parts)
        }
    return sorted(p for p in paths if p.is_file() and not p.is_symlink())


def markdown_docs() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the lines outside fenced code blocks."""
    lines: list[tuple[int, str]] = []
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        match = _FENCE.match(line)
        if match:
            if fence is None:
                fence = match.group(1)
            elif match.group(1) == fence:
                fence = None
        elif fence is None:
            lines.append((number, line))
    return lines


def links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every inline link, image and reference definition."""
    found: list[tuple[int, str]] = []
    for number, line in _prose_lines(path.read_text()):
        line = _CODE_SPAN.sub("", line)
        found += [(number, t) for t in _INLINE_LINK.findall(line)]
        ref = _REF_DEF.match(line)
        if ref:
            found.append((number, ref.group(1)))
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor a Markdown file offers: its headings (duplicates numbered) and HTML ids."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    text = path.read_text()
    for _, line in _prose_lines(text):
        heading = _HEADING.match(line)
        if heading:
            base = slug(heading.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    out.update(_HTML_ANCHOR.findall(text))
    return out


def test_nothing_names_or_links_the_teams_notes_outside_the_repository() -> None:
    me = Path(__file__).resolve()
    offenders = []
    for path in repo_files():
        if path.resolve() == me:  # this file spells the names out to look for them
            continue
        data = path.read_bytes()
        for match in OUTSIDE.finditer(data):
            line = data.count(b"\n", 0, match.start()) + 1
            offenders.append(f"{path.relative_to(REPO)}:{line}: {match.group().decode()}")
    assert offenders == [], (
        "the product's files must stand alone; write what they need into docs/ "
        "(docs/field-guide.md) and link that:\n" + "\n".join(offenders)
    )


def test_every_relative_link_in_the_docs_resolves_to_a_file_in_the_repository() -> None:
    root = REPO.resolve()
    broken = []
    for doc in markdown_docs():
        for number, target in links(doc):
            if _SCHEME.match(target) or target.startswith("#"):
                continue
            file_part = unquote(target.split("#", 1)[0].split("?", 1)[0])
            resolved = (doc.parent / file_part).resolve()
            where = f"{doc.relative_to(REPO)}:{number}: {target}"
            if not resolved.is_relative_to(root):
                broken.append(f"{where} (outside the repository)")
            elif not resolved.exists():
                broken.append(f"{where} (no such file)")
    assert broken == [], "\n".join(broken)


def test_every_anchor_a_doc_links_to_exists() -> None:
    broken = []
    cache: dict[Path, set[str]] = {}
    for doc in markdown_docs():
        for number, target in links(doc):
            if _SCHEME.match(target) or "#" not in target:
                continue
            file_part, fragment = target.split("#", 1)
            dest = (doc.parent / unquote(file_part)).resolve() if file_part else doc.resolve()
            if dest.suffix != ".md" or not dest.is_file():
                continue  # a missing file is the test above's; other files have no anchors
            if dest not in cache:
                cache[dest] = anchors(dest)
            if unquote(fragment).lower() not in cache[dest]:
                broken.append(f"{doc.relative_to(REPO)}:{number}: {target}")
    assert broken == [], "\n".join(broken)


def test_the_field_guide_is_linked_from_the_readme_and_the_diagnosis() -> None:
    for doc in (REPO / "README.md", REPO / "docs" / "diagnosis.md"):
        targets = {(doc.parent / t.split("#", 1)[0]).resolve() for _, t in links(doc)}
        assert (REPO / "docs" / "field-guide.md").resolve() in targets, doc.name


def test_docs_validation_holds_outputs_only() -> None:
    """Issue 36: scripts kept there as `.py.txt` copies escaped the linters and went
    stale; a script that makes a record is code under validation/."""
    scripts = [p.relative_to(REPO) for p in (REPO / "docs" / "validation").rglob("*")
               if p.name.endswith((".py", ".py.txt", ".sh"))]
    assert scripts == []
