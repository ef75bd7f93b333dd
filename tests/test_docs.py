"""The README is a front door (<= 20,000 bytes), every relative link in README.md and docs/*.md points at a
file that exists, and every file in benchmarks/results/ (outside archive/) is named in its index."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
LINK = re.compile(r"\]\(([^)\s]+)\)|^\[[^\]]+\]:\s*(\S+)", re.MULTILINE)


def _relative_links(md: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", md.read_text(), flags=re.DOTALL)
    links = [a or b for a, b in LINK.findall(text)]
    return [u for u in links if not re.match(r"^[a-z]+:", u) and not u.startswith("#")]


def test_readme_is_at_most_20_kb() -> None:
    size = (ROOT / "README.md").stat().st_size
    assert size <= 20_000, f"README.md is {size} bytes"


def test_relative_links_point_at_files_that_exist() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), RESULTS / "README.md"]
    broken = []
    for page in pages:
        for link in _relative_links(page):
            target = (page.parent / link.split("#", 1)[0]).resolve()
            if not target.exists():
                broken.append(f"{page.relative_to(ROOT)}: {link}")
    assert not broken, broken


def test_every_results_file_is_in_the_index() -> None:
    index = (RESULTS / "README.md").read_text()
    missing = [p.name for p in sorted(RESULTS.iterdir())
               if p.name != "README.md" and p.name != "archive" and f"`{p.name}`" not in index]
    assert not missing, f"benchmarks/results/README.md does not name {missing}"


def test_readme_has_the_sections_a_new_user_needs_in_order() -> None:
    headings = re.findall(r"^## (.+)$", (ROOT / "README.md").read_text(), flags=re.MULTILINE)
    wanted = ["Two commands", "Run a fleet", "Add a worker", "Tune for your model", "zmlx", "Configuration",
              "Measured results", "Links"]
    assert [h for h in headings if h in wanted] == wanted, headings
