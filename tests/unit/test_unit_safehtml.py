"""A rank's HTML in the saved snapshot (nbspawn/views/_safehtml.py through views/_bundle.py): nothing
that can act when a trusted notebook is reopened, what shows kept (issue 30, item 2)."""

from __future__ import annotations

import re

import pytest
from bundle_reader import HOSTILE_HTML, SHOWN_HTML, acting_markup, markup, rank_outputs

from nbspawn.views._bundle import entries_html
from nbspawn.views._tail import OutputTail


def _saved_pane(*htmls: str) -> str:
    """A rank's pane as the snapshot saves it: each HTML as a display, then a line of its own."""
    tail = OutputTail()
    for value in htmls:
        tail.display({"kind": "data", "id": None, "mime": "text/html", "value": value, "text": "html"})
    tail.add("stdout", "the line after\n")
    return f'<div class="nbspawn-output" data-rank="0">{entries_html(list(tail.entries.values()))}</div>'


@pytest.mark.parametrize("hostile", HOSTILE_HTML)
def test_hostile_html_is_inert_in_the_saved_snapshot(hostile):
    page = _saved_pane(hostile)
    assert acting_markup(page) == []
    saved = rank_outputs(page)[0]
    # the pane reads back whole: one display, then the rank's own line (nothing swallowed, nothing faked)
    assert [kind for kind, _ in saved.order] == ["display", "line"]
    assert saved.lines == [("stdout", "the line after\n")]
    word = re.sub(r"<[^>]*>", "", hostile).split(">")[-1].strip()
    if word and "alert" not in word:
        assert word in saved.displays[0].get("text", ""), (word, saved.displays[0]["html"])


def test_all_hostile_html_at_once_is_inert():
    page = _saved_pane(*HOSTILE_HTML)
    assert acting_markup(page) == []
    saved = rank_outputs(page)[0]
    assert len(saved.displays) == len(HOSTILE_HTML) and saved.lines == [("stdout", "the line after\n")]
    assert "alert" not in page


def test_tables_styles_images_and_links_stay():
    page = _saved_pane(SHOWN_HTML)
    assert acting_markup(page) == []
    tags = markup(page)
    names = [tag for tag, _ in tags]
    for tag in ("table", "thead", "tbody", "tr", "th", "td", "pre", "img", "a"):
        assert tag in names, (tag, names)
    attrs = {tag: a for tag, a in tags if tag in ("table", "td", "img", "a", "pre")}
    assert attrs["table"]["border"] == "1" and attrs["table"]["class"] == "dataframe"
    assert "color:rgb(1, 2, 3)" in attrs["td"]["style"].replace(": ", ":") and "font-weight" in attrs["td"]["style"]
    assert attrs["img"]["src"] == "data:image/png;base64,iVBORw0KGgo=" and attrs["img"]["width"] == "4"
    assert attrs["a"]["href"] == "https://pytorch.org/" and "noopener" in attrs["a"]["rel"]
    assert "Menlo" in attrs["pre"]["style"]
    assert "42" in rank_outputs(page)[0].displays[0]["text"]
