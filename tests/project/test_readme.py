"""The README stays short (under 200 lines, detail in docs/) and every file it links to exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_is_under_200_lines_and_its_links_resolve():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 200
    links = {m.split("#")[0] for m in re.findall(r"\]\(([^)]+)\)", text) if "://" not in m}
    missing = sorted(link for link in links if link and not (ROOT / link).exists())
    assert missing == [], missing
