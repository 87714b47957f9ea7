"""ANSI colours as one current style (nbspawn/views/_sgr.py), in the kernel's kept lines and the saved
HTML (issue 30, item 1): a coloured bar's kept line stays one frame long however often it is redrawn,
and each SGR case reaches the saved snapshot as a terminal shows it, with no raw escape byte."""

from __future__ import annotations

import re

import pytest

from nbspawn.views._bundle import line_html
from nbspawn.views._sgr import apply_sgr, sgr_params, sgr_sequence, style_after, style_css
from nbspawn.views._tail import Line, OutputTail, settle_rewrites


def _saved(text: str, complete: bool = True) -> str:
    """One line of a rank's stdout as the saved snapshot's HTML holds it."""
    tail = OutputTail()
    tail.add("stdout", text + ("\n" if complete else ""))
    (line,) = tail.entries.values()
    assert isinstance(line, Line)
    return line_html(line)


def _runs(page: str) -> list[tuple[str | None, str]]:
    """(style, text) of each run of a saved line; None for unstyled text."""
    runs = []
    body = page.removeprefix('<span data-s="o">').removesuffix("</span>").removesuffix("&#10;")
    for style, text, plain in re.findall(r'<span data-sgr="[^"]*" style="([^"]*)">([^<]*)</span>|([^<]+)', body):
        runs.append((style, text) if style else (None, plain))
    return runs


# -- the style machine --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "style"),
    [
        ("1;32", {"bold": True, "fg": 2}),
        ("38;5;208;48;2;1;2;255", {"fg": 208, "bg": "#0102ff"}),
        ("38:2::10:20:30", {"fg": "#0a141e"}),  # T.416: a colour-space slot before r, g, b
        ("38:2:7:10:20:30", {"fg": "#0a141e"}),
        ("38:2:10:20:30", {"fg": "#0a141e"}),  # the slot left out, as many programs write it
        ("48:5:208", {"bg": 208}),
        ("38:2::10:20:30;1", {"fg": "#0a141e", "bold": True}),  # a colon group never eats the next group
        ("4:3", {"underline": True}),
        ("94;101", {"fg": 12, "bg": 9}),
        ("38;5", {}),  # malformed: ignored
    ],
)
def test_apply_sgr(params, style):
    assert apply_sgr({}, params) == style


def test_switching_off_keeps_the_other_attributes():
    style = apply_sgr({}, "1;4;9;38;2;10;20;30;48;5;208")
    assert {k: v for k, v in apply_sgr(style, "22").items() if v is not False} == {
        "underline": True, "strike": True, "fg": "#0a141e", "bg": 208,
    }  # fmt: skip
    assert apply_sgr(style, "39")["fg"] is False and apply_sgr(style, "49")["bg"] is False
    assert apply_sgr(style, "0") == {"reset": True} and apply_sgr(style, "") == {"reset": True}


@pytest.mark.parametrize(
    "codes",
    ["\x1b[1;31m", "\x1b[38;5;208m\x1b[22m", "\x1b[0m\x1b[4m", "\x1b[1m\x1b[22m\x1b[2m", "\x1b[38:2::1:2:3m\x1b[49m", ""],
)
@pytest.mark.parametrize("before", [{}, {"bold": True, "fg": 3, "bg": "#010203", "strike": True}])
def test_one_sequence_has_the_effect_of_the_history(codes, before):
    """What a bar's kept line carries in place of its old frames' codes: from any style the stream
    had, the one sequence leaves the same style as the codes it replaces."""
    seen = {k: v for k, v in style_after(codes, before).items() if v and k != "reset"}
    one = {k: v for k, v in style_after(sgr_sequence(style_after(codes)), before).items() if v and k != "reset"}
    assert one == seen


def test_parameters_and_css_of_a_style():
    style = apply_sgr({}, "1;2;3;4;9;38;2;10;20;30;48;5;250")
    assert sgr_params(style) == "1;2;3;4;9;38;2;10;20;30;48;5;250"
    assert apply_sgr({}, sgr_params(style)) == style  # data-sgr read back (labextension/src/mime.ts)
    assert style_css(style) == (
        "color:rgb(10,20,30);background:rgb(188,188,188);font-weight:bold;opacity:0.7;font-style:italic;"
        "text-decoration:underline line-through"
    )
    assert sgr_params(apply_sgr({}, "33;104")) == "33;104" and sgr_params({"fg": False}) == ""


# -- the saved snapshot ------------------------------------------------------------------------------


def test_39_ends_a_256_colour_and_a_truecolour_foreground():
    assert _runs(_saved("\x1b[38;5;208mA\x1b[39mB")) == [("color:rgb(255,135,0)", "A"), (None, "B")]
    assert _runs(_saved("\x1b[38;2;1;2;3;44mA\x1b[39mB")) == [
        ("color:rgb(1,2,3);background:#0969da", "A"), ("background:#0969da", "B"),
    ]  # fmt: skip


def test_22_ends_bold_and_keeps_a_truecolour():
    assert _runs(_saved("\x1b[1;38;2;10;20;30mA\x1b[22mB")) == [
        ("color:rgb(10,20,30);font-weight:bold", "A"), ("color:rgb(10,20,30)", "B"),
    ]  # fmt: skip


def test_underline_and_strike_through_are_both_kept():
    assert _runs(_saved("\x1b[4m\x1b[9mboth\x1b[24m strike")) == [
        ("text-decoration:underline line-through", "both"), ("text-decoration:line-through", " strike"),
    ]  # fmt: skip


def test_an_osc_8_link_leaves_its_text_and_no_escape():
    page = _saved("see \x1b]8;;https://example.org/x\x1b\\the docs\x1b]8;;\x1b\\ and \x1b]8;;https://a.b\x07this\x1b]8;;\x07.")
    assert _runs(page) == [(None, "see the docs and this.")]
    assert "\x1b" not in page and "example.org" not in page


def test_a_link_not_ended_yet_and_other_controls_leave_no_escape():
    page = _saved("a \x1b]8;;https://example.org/x\x1b\\b\x1b]8;;https://c", complete=False)
    assert _runs(page) == [(None, "a b")]
    assert "\x1b" not in _saved("bell\x07 and \x1b(B charset \x1bM up") and "\x07" not in _saved("bell\x07")


def test_colon_form_colours_are_read_and_not_shown():
    assert _runs(_saved("\x1b[38:2::255:0:0mred\x1b[39m \x1b[48:5:21mblue\x1b[0m")) == [
        ("color:rgb(255,0,0)", "red"), (None, " "), ("background:rgb(0,0,255)", "blue"),
    ]  # fmt: skip


def test_a_bar_keeps_the_colour_of_its_earlier_frames():
    page = _saved("\x1b[1;32m\r 10%\r\x1b[4m 20%\x1b[22m!")
    assert _runs(page) == [
        ("color:#116329;font-weight:bold;text-decoration:underline", " 20%"),
        ("color:#116329;text-decoration:underline", "!"),
    ]


# -- the kernel's kept line -----------------------------------------------------------------------------


def _frame(i: int) -> str:
    """One redraw of a coloured bar, as tqdm(colour=...) and rich draw them: several codes a frame."""
    done = i % 40
    return (
        f"\r\x1b[1mepoch {i // 1000}\x1b[22m \x1b[38;2;{i % 256};100;50m{'█' * done}\x1b[39m"
        f"\x1b[38;5;240m{'━' * (40 - done)}\x1b[0m \x1b[32m{i}/20000\x1b[0m"
    )


def test_a_coloured_bar_redrawn_20000_times_keeps_a_line_of_one_frame():
    tail = OutputTail()
    tail.add("stderr", "\x1b[35m")  # a colour set before the bar, still in force
    longest = max(len(_frame(i)) for i in range(20_000))
    for i in range(20_000):
        tail.add("stderr", _frame(i))
        (line,) = tail.entries.values()
        assert isinstance(line, Line)
        assert len(line.text) <= 2 * longest, (i, len(line.text))
    assert line.plain == "epoch 19 " + "█" * 39 + "━ 19999/20000"
    assert line.text.startswith("\x1b[0m\r")  # the frames' history is one reset: the magenta is over


def test_settle_rewrites_keeps_one_sequence_for_the_frames_it_drops():
    frames = "".join(f"\r\x1b[3{i % 8}m{i}%\x1b[1m" for i in range(100))
    assert settle_rewrites(frames) == "\x1b[1;32m\r\x1b[33m99%\x1b[1m"
    assert settle_rewrites("\x1b[31mred\x1b[39m\rplain") == "\x1b[39m\rplain"
