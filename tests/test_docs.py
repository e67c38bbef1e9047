"""
The README is a front page (at most 250 lines, with a table of contents whose anchors resolve), and every relative link
in the README and in docs/*.md points to a file that exists and, when it names one, to a heading of that file.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
MAX_README_LINES = 250
LINK = re.compile(r"(?<!!)\[(?:[^\]`]|`[^`]*`)*\]\(([^)\s]+)\)")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks (a `# comment` in a shell block is not a heading)."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return out


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped (not `-` or `_`), spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a markdown file, with GitHub's `-1`, `-2` suffixes for repeated headings."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose_lines(path.read_text()):
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        anchor = github_anchor(match.group(1))
        count = seen.get(anchor, 0)
        seen[anchor] = count + 1
        found.add(anchor if count == 0 else f"{anchor}-{count}")
    return found


def relative_links(path: Path) -> list[str]:
    """The link targets of a markdown file that are not URLs (web, mail) and not inside code."""
    links = []
    for line in prose_lines(path.read_text()):
        line = re.sub(r"``[^`]*``", "", line)
        for target in LINK.findall(line):
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target):
                links.append(target)
    return links


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def broken(path: Path, target: str) -> str | None:
    """Why a relative link of `path` does not resolve, or None when it does."""
    file_part, _, anchor = target.partition("#")
    destination = (path.parent / file_part).resolve() if file_part else path
    if not destination.exists():
        return f"{shown(path)}: {target}: no file {file_part}"
    if anchor and destination.suffix == ".md" and anchor not in anchors(destination):
        return f"{shown(path)}: {target}: no heading #{anchor} in {shown(destination)}"
    return None


def test_the_readme_fits_on_a_front_page():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines; move a section to docs/"


def test_the_readme_has_a_table_of_contents_that_resolves():
    text = README.read_text()
    assert "\n## Contents\n" in text, "README.md has no '## Contents' section"
    toc = text.split("\n## Contents\n", 1)[1].split("\n## ", 1)[0]
    entries = re.findall(r"^- \[[^\]]+\]\(#([^)]+)\)", toc, flags=re.M)
    sections = [github_anchor(h) for h in re.findall(r"^## (.+)$", "\n".join(prose_lines(text)), flags=re.M)]
    assert entries, "the Contents section lists no links"
    missing = [anchor for anchor in entries if anchor not in anchors(README)]
    assert not missing, f"Contents links to headings README.md lacks: {missing}"
    unlisted = [s for s in sections if s not in entries and s not in ("contents", "license")]
    assert not unlisted, f"README.md sections missing from its Contents: {unlisted}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    problems = [problem for target in relative_links(page) if (problem := broken(page, target))]
    assert not problems, "\n".join(problems)


def test_every_docs_page_is_reachable_from_the_readme():
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in relative_links(README)}
    unlinked = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert not unlinked, f"docs pages the README does not link to: {unlinked}"


def test_every_docs_page_starts_with_what_a_user_does_with_it():
    for page in PAGES[1:]:
        if page.name == "API.md":  # generated from the docstrings
            continue
        lines = page.read_text().splitlines()
        assert lines[0].startswith("# ") and lines[2].startswith("Use this page"), page.name


def test_the_link_checker_sees_a_broken_link(tmp_path):
    """The checker must be able to fail: a missing file and a missing heading are both reported."""
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n\n## A `code` heading, with punctuation\n\n[x](#title) [y](#a-code-heading-with-punctuation)\n"
    )
    assert [broken(page, t) for t in relative_links(page)] == [None, None]
    assert broken(page, "missing.md") and broken(page, "#no-such-heading")
    assert relative_links(page) == ["#title", "#a-code-heading-with-punctuation"]


def test_the_readme_puts_a_trl_user_first():
    """Installing into a TRL project, the set-up commands and the import swap come first, in that order."""
    sections = re.findall(r"^## (.+)$", "\n".join(prose_lines(README.read_text())), flags=re.M)
    assert sections[1:4] == [
        "Install into an existing TRL project",
        "Set-up on a fresh machine: two commands",
        "Quick start: the import swap",
    ], sections


def test_the_gpu_note_comes_before_the_commands_that_install_torch():
    """A GPU user must read how to keep their CUDA torch before the first command that would replace it."""
    text = README.read_text()
    first_install = text.index("```bash\nmake demo")
    assert -1 < text.find("TORCH=") < first_install, "the note on `TORCH=` must precede the `make demo` block"


def test_a_reference_to_another_section_is_a_link():
    """`see "Some section" above` breaks when a section moves to another page (one pointed the wrong way): link it."""
    quoted = re.compile(r"\b[Ss]ee \"[A-Z][^\"]+\"")
    found = [
        f"{page.relative_to(ROOT)}: {match.group(0)}"
        for page in PAGES
        for line in prose_lines(page.read_text())
        for match in quoted.finditer(line)
    ]
    assert not found, "write these as [section](page.md#anchor) links:\n" + "\n".join(found)


def test_the_readme_states_no_test_count_that_goes_stale():
    """Test counts change with every test added: the README says how to print them (`--collect-only`) instead."""
    counts = re.findall(r"\b\d[\d,]*\s+(?:tests|collected)\b", README.read_text())
    assert not counts, f"README.md states test counts {counts}; point to `python -m pytest --collect-only -q`"
