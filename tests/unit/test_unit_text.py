"""Unit tests of nbspawn.views._text's pure functions: a line as a terminal settles it (\\r, \\b), a
display item and a widget tree as text (docs/run-bundle.md, section 2), and a footer line clipped to
the terminal's width. No kernel, no processes (tests/kernel/test_terminal.py drives the view in a real
terminal)."""

from __future__ import annotations

import base64
import io
import struct

import pytest

from nbspawn.events._widgetbar import widget_text
from nbspawn.views._text import (
    WIDGET_MIME,
    TextView,
    clip,
    columns,
    erase_backspaces,
    graphemes,
    item_text,
    joined_clusters,
    settle_line,
)

# -- settle_line, erase_backspaces ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("abc", "abc"),
        ("abc\r", "abc"),  # a trailing \r redraws nothing
        ("a\rbc", "bc"),
        ("10%\r20%\r", "20%"),  # tqdm: the latest state
        ("long line\rshort", "short"),  # a terminal would show "shortline": the bar's own redraw wins
        ("\r\r", ""),
        ("a\rb\r\r", "b"),
        ("x\r\rfoo\b", "fo"),  # \r first, then \b
        ("", ""),
    ],
)
def test_settle_line(raw, shown):
    assert settle_line(raw) == shown


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("no backspace", "no backspace"),
        ("ab\bc", "ac"),
        ("ab\b\bc", "c"),
        ("\b", ""),  # nothing to erase
        ("a\b\b\bb", "b"),  # more \b than characters
        ("tqdm\b\b\b\bTQDM", "TQDM"),
        ("é\bx", "x"),
    ],
)
def test_erase_backspaces(text, shown):
    assert erase_backspaces(text) == shown


# -- widget_text ----------------------------------------------------------------------------------


def progress(value, low=0, high=100, description="", **kw) -> dict:
    return {"type": "progress", "min": low, "max": high, "value": value, "description": description, **kw}


def text(value: str) -> dict:
    return {"type": "text", "value": value}


def test_a_tqdm_notebook_bar_reads_as_tqdms_text_bar():
    row = {"type": "row", "children": [text("Epoch 1:\u2007 45%"), progress(45), text(" 45/100 [00:01<00:02]")]}
    assert widget_text(row) == "Epoch 1:  45%|████▌     | 45/100 [00:01<00:02]"  # figure space -> space


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (0, "load:   0%|          |"),
        (1, "load:   1%|          |"),
        (45, "load:  45%|████▌     |"),
        (50, "load:  50%|█████     |"),
        (99, "load:  99%|█████████▉|"),
        (100, "load: 100%|██████████|"),
        (120, "load: 100%|██████████|"),  # clamped
        (-5, "load:   0%|          |"),
    ],
)
def test_a_lone_progress_bar_has_its_description_and_percentage(value, shown):
    assert widget_text(progress(value, description="load")) == shown


def test_eighth_blocks():
    assert widget_text(progress(1, high=80)) == "  1%|▏         |"  # one eighth of a cell
    assert widget_text(progress(3, high=80)) == "  4%|▍         |"


@pytest.mark.parametrize("node", [progress(0, high=0), progress(5, low=10, high=10), progress(True, high=10), progress(None)])
def test_a_progress_bar_without_a_usable_range_is_empty(node):
    assert widget_text(node) == "  0%|          |"


def test_a_progress_bar_beside_text_keeps_its_description():
    row = {"type": "row", "children": [progress(1, high=4, description="d"), text(" 1/4")]}
    assert widget_text(row) == "d |██▌       | 1/4"


def test_a_column_is_one_line_per_child_empty_ones_dropped():
    column = {"type": "box", "dir": "column", "children": [text("a"), text(""), {"type": "other", "text": "b"}]}
    assert widget_text(column) == "a\nb"


@pytest.mark.parametrize("tree", ["a string", None, 3, {"type": "text"}, {"type": "other"}, {"children": None}])
def test_nothing_to_say(tree):
    assert widget_text(tree) == ""


def test_children_that_are_not_nodes_are_skipped():
    assert widget_text({"type": "row", "children": [1, "x", text("kept")]}) == "kept"


# -- item_text ------------------------------------------------------------------------------------


def png(width: int, height: int) -> str:
    head = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + struct.pack(">II", width, height)
    return base64.b64encode(head + b"\x08\x02\x00\x00\x00" + b"\0" * 20).decode()


def gif(width: int, height: int) -> str:
    return base64.b64encode(b"GIF89a" + struct.pack("<HH", width, height) + b"\0" * 20).decode()


@pytest.mark.parametrize(
    ("item", "shown"),
    [
        ({"mime": "text/plain", "value": "42"}, "42"),
        ({"mime": "text/plain", "value": None, "text": "<image dropped>"}, "<image dropped>"),  # what the kernel says
        ({"mime": "text/plain"}, ""),
        ({"mime": "image/png", "value": "xx", "text": "<Figure size 640x480>"}, "<Figure size 640x480>"),
        ({"mime": "image/png", "value": "xx", "meta": {"width": 640, "height": 480}}, "<image/png 640×480>"),
        ({"mime": "image/jpeg", "value": "xx", "meta": {"width": 10.5, "height": 3}}, "<image/jpeg 10.5×3>"),
        ({"mime": "image/png", "value": png(32, 16)}, "<image/png 32×16>"),  # read from the PNG's header
        ({"mime": "image/gif", "value": gif(7, 9)}, "<image/gif 7×9>"),
        ({"mime": "image/png", "value": png(32, 16), "meta": {"width": 3, "height": 4}}, "<image/png 3×4>"),  # meta wins
        ({"mime": "image/png", "value": "xx"}, "<image/png>"),
        ({"mime": "image/png", "value": "!!!not base64"}, "<image/png>"),
        ({"mime": "image/jpeg", "value": png(32, 16)}, "<image/jpeg>"),  # only PNG and GIF headers are read
        ({"mime": "image/png", "value": "xx", "meta": {"width": "640", "height": 480}}, "<image/png>"),
        ({"mime": "text/html", "value": "<table><tr><td>a &amp; b</td></tr>\n<tr><td> c </td></tr></table>\n<br>"}, "a & b\nc"),
        ({"mime": "application/json", "value": "{}"}, "{}"),
        ({"mime": "application/json", "value": {"a": 1}}, ""),
        ({"mime": WIDGET_MIME, "value": progress(1, high=2)}, " 50%|█████     |"),
        ({}, ""),
    ],
)
def test_item_text(item, shown):
    assert item_text(item) == shown


# -- clip -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("width", "shown"), [(0, ""), (3, "hel"), (5, "hello"), (11, "hello world"), (80, "hello world")])
def test_clip_to_width(width, shown):
    assert clip("hello world", width) == shown


def test_clip_keeps_colours_and_resets_them():
    assert clip("\x1b[31mred text\x1b[0m", 3) == "\x1b[31mred\x1b[0m"
    assert clip("\x1b[1;32mok\x1b[0m", 10) == "\x1b[1;32mok\x1b[0m\x1b[0m"


def test_clip_counts_terminal_columns():
    assert clip("日本語", 5) == "日本"  # wide characters take two columns
    assert clip("e\u0301x", 2) == "e\u0301x"  # a combining accent takes none
    assert clip("a\tb", 20) == "a       b"  # tabs expanded to 8 columns
    assert clip("a\tb", 4) == "a   "


def test_clip_drops_other_escapes_and_controls():
    assert clip("a\x1b[2Kb\x07c\x7fd\re", 10) == "abcde"
    assert clip("\x1b[Aup", 10) == "up"


def test_clip_drops_an_osc_sequence():
    assert clip("\x1b]0;title\x07abc", 10) == "abc"


# -- clip: grapheme clusters whole, measured by wcwidth (issue 30, item 5) ---------------------------

FAMILY = "\U0001f468\u200d\U0001f469\u200d\U0001f467"  # man ZWJ woman ZWJ girl: one emoji, 2 columns
FLAGS = "\U0001f1eb\U0001f1f7\U0001f1e9\U0001f1ea"  # FR DE
THUMB = "\U0001f44d\U0001f3fd"  # thumbs up, medium skin tone
HEART = "\u2764\ufe0f"  # heart + VS16: emoji presentation, 2 columns


@pytest.mark.parametrize(
    ("line", "width", "shown"),
    [
        ("ab" + FAMILY, 3, "ab"),  # never a lone man, never a trailing joiner
        ("ab" + FAMILY, 4, "ab" + FAMILY),
        ("ab" + FAMILY + "!", 5, "ab" + FAMILY + "!"),
        (FLAGS, 1, ""),
        (FLAGS, 3, FLAGS[:2]),  # never half a flag
        (FLAGS, 4, FLAGS),
        (THUMB + "!", 2, THUMB),  # the skin tone stays with its hand
        (THUMB + "!", 1, ""),
        (HEART + "x", 2, HEART),
        ("\x1b[32m" + FAMILY + "\x1b[0m ok", 2, "\x1b[32m" + FAMILY + "\x1b[0m\x1b[0m"),
    ],
)
def test_clip_never_cuts_a_grapheme_cluster(line, width, shown):
    assert clip(line, width) == shown


@pytest.mark.parametrize(
    ("text", "clusters"),
    [
        ("ab" + FAMILY + "!", ["a", "b", FAMILY, "!"]),
        (FLAGS + "x", [FLAGS[:2], FLAGS[2:], "x"]),
        (THUMB + HEART, [THUMB, HEART]),
        ("e\u0301x", ["e\u0301", "x"]),
    ],
)
def test_clusters_as_wcwidth_and_as_an_old_wcwidth_tell_them(text, clusters):
    """``graphemes`` (Unicode's rules, wcwidth >= 0.3) and ``joined_clusters`` (what clip falls back
    on with an older wcwidth, as a runtime may have) agree on what a bar's text holds."""
    assert list(graphemes(text)) == clusters
    assert list(joined_clusters(text)) == clusters


def test_a_cluster_is_measured_whole():
    assert [columns(c) for c in (FAMILY, FLAGS[:2], THUMB, HEART, "e\u0301", "日", "a")] == [2, 2, 2, 2, 1, 2, 1]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("terminal", [True, False])
def test_a_pdb_commands_echo_is_printed_where_no_terminal_shows_it_already(terminal):
    """On a terminal the command typed at the prompt is on the screen: the rank's echo of it is left
    out there; in a notebook's cell it is printed, right above pdb's answer."""
    out = _Terminal() if terminal else io.StringIO()
    view = TextView(stdout=out, stderr=io.StringIO(), live=False)
    view.command_answered(1, "(Pdb rank 1) p x")
    view.output(1, "stdout", "(Pdb rank 1) p x\n17\n")
    view.output(1, "stdout", "(Pdb rank 1) p x\n")  # a later line that reads the same is the rank's own
    echo = [] if terminal else ["[rank1]: (Pdb rank 1) p x"]
    assert out.getvalue().splitlines() == [*echo, "[rank1]: 17", "[rank1]: (Pdb rank 1) p x"]


def test_a_line_left_open_is_printed_before_what_the_rank_wrote_after_it():
    """``write("abc")``, then the cell's value shown, or a line on stderr: "abc" came first, so it is
    printed first (it once waited for its line's end, and came out last). A bar being redrawn stays
    in the footer."""
    terminal = io.StringIO()  # both streams, as a notebook cell shows them: in one order
    view = TextView(stdout=terminal, stderr=terminal, live=False)
    view.output(0, "stdout", "abc")
    view.display(0, {"kind": "data", "mime": "text/plain", "value": "42"})
    view.output(0, "stdout", "de")
    view.output(0, "stdout", "f")  # the same line, continued
    view.output(0, "stderr", "warned\n")
    view.output(0, "stdout", "\rbar 50%")
    view.output(0, "stderr", "again\n")
    view.output(0, "stdout", "\rbar 100%\n")
    assert terminal.getvalue().splitlines() == [
        "[rank0]: abc",
        "[rank0]: 42",
        "[rank0]: def",
        "[rank0]: warned",
        "[rank0]: again",
        "[rank0]: bar 100%",
    ]
