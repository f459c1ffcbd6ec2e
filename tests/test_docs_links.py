"""The README stays short and for users; every relative link in the project's Markdown leads
somewhere (a moved section leaves no dead link behind)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md", ROOT / "benchmarks" / "README.md",
         *sorted((ROOT / "docs").glob("*.md"))]
# Pages other branches add (security, outputs, the monitor's widgets): linked from the index already.
COMING: set[str] = set()  # pages linked before they are written (none now)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def test_the_readme_is_short_and_starts_with_what_gpunb_is():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200, "README.md is for users in a hurry: the reference goes in docs/"
    assert "pip install ." in text and "%load_ext gpunb" in text  # from a checkout: not on PyPI yet
    for magic in ("%gpucheck", "%gpumonitor", "%%gpuprofile", "%gpumem", "%gpufit", "OOM doctor"):
        assert magic in text, f"the README names every magic: {magic}"


def test_every_relative_link_leads_to_a_file():
    dead = []
    for page in PAGES:
        for target in LINK.findall(page.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a web address, or a place on the same page
            path = (page.parent / target.split("#", 1)[0]).resolve()
            if not path.exists() and path.relative_to(ROOT).as_posix() not in COMING:
                dead.append(f"{page.relative_to(ROOT)}: {target}")
    assert not dead, f"links to nothing: {dead}"


def test_the_docs_index_links_every_page_in_docs():
    index = (ROOT / "docs" / "README.md").read_text(encoding="utf-8")
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"README.md"}
    missing = sorted(name for name in pages if f"]({name})" not in index)
    assert not missing, f"docs/README.md does not link {missing}"
