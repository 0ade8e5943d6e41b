"""The field-level protection pages stay a few hundred lines each, one concept a page, and
the rotation page describes the rule the code follows (FF1 and tokens name a version)."""

from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGES = ["fields.md", "fields-ingestion.md", "fields-rotation.md", "fields-scan.md",
         "fields-policies.md"]


@pytest.mark.parametrize("page", PAGES)
def test_a_field_page_is_a_few_hundred_lines(page):
    lines = (DOCS / page).read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300, f"{page} has {len(lines)} lines: split it by concept"


def test_the_overview_links_every_field_page():
    overview = (DOCS / "fields.md").read_text(encoding="utf-8")
    for page in PAGES[1:]:
        assert f"]({page})" in overview, page


def test_the_rotation_page_names_the_version_rule():
    text = (DOCS / "fields-rotation.md").read_text(encoding="utf-8")
    assert "version := 1" in text and "refuse to run without it" in text
    assert "cards_ff1_v1" not in text  # no second name for an old version
