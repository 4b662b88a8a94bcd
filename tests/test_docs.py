"""The README is a front page into docs/: short, and every link it gives leads somewhere."""

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_stays_a_front_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250, "README.md grew past 250 lines: move the detail into a docs/ page"
    assert "pip install -e '.[dev]' && sp-dagster up" in readme and "bash tests/run" in readme


def test_the_readmes_relative_links_resolve():
    readme = (ROOT / "README.md").read_text()
    targets = [t for t in re.findall(r"\]\(([^)\s]+)\)", readme) if not re.match(r"[a-z]+:|#|\.\./", t)]
    assert targets, "the README links into docs/"
    missing = [t for t in targets if not (ROOT / t.split("#")[0]).is_file()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_every_docs_page_is_in_the_site_navigation():
    text = (ROOT / "mkdocs.yml").read_text()
    nav = yaml.safe_load(text[text.index("\nnav:") :])["nav"]

    def pages(entries):
        for entry in entries:
            value = next(iter(entry.values())) if isinstance(entry, dict) else entry
            yield from pages(value) if isinstance(value, list) else [value]

    listed = set(pages(nav))
    on_disk = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    assert on_disk == listed, f"pages not in mkdocs.yml's nav: {sorted(on_disk - listed)}; listed but missing: {sorted(listed - on_disk)}"
