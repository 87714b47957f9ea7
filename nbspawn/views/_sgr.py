"""ANSI colour codes (SGR) as one current style, never as the history of codes that made it.

A progress bar redrawn 20,000 times with colours sends 20,000 colour codes; what is in force after
them is a handful of attributes.  Keeping the style instead of the codes keeps a bar's kept line
the size of one frame however long it runs (``_tail.settle_rewrites``), and gives the saved HTML
each attribute exactly once (``_bundle.line_html``).  The rules are those of
``labextension/src/text.ts`` (``applySGR``), its twin in the browser.

A *style* is a dict of attributes: ``fg``/``bg`` (a palette index 0-255 or ``"#rrggbb"``) and the
flags ``bold``, ``dim``, ``italic``, ``underline``, ``inverse``, ``strike``.  As a *change* to
whatever style came before (the codes of a bar's earlier frames, replayed on a stream whose style
is not known here) an attribute may also be ``False``, switched off, and ``reset`` means a full
reset came first: :func:`sgr_sequence` writes the one sequence with that effect.
"""

from __future__ import annotations

import re
from typing import Any

Style = dict[str, Any]

# CSI sequences, OSC strings (a title, an OSC 8 link: ESC ] ... BEL or ESC \, or not ended yet at the
# end of the text), a charset choice, then any other two-byte escape: nothing of them is shown
ESCAPE = re.compile(r"\x1b(?:\[[0-9;:?<=>]*[ -/]*[@-~]|\][^\x07\x1b\r\n]*(?:\x07|\x1b\\|\Z)|[()*+][ -~]|[@-Z\\-_])")
SGR = re.compile(r"\x1b\[([0-9;:]*)m")

_FLAGS = {"bold": 1, "dim": 2, "italic": 3, "underline": 4, "inverse": 7, "strike": 9}
_OFF = {"bold": 22, "dim": 22, "italic": 23, "underline": 24, "inverse": 27, "strike": 29, "fg": 39, "bg": 49}
_SET = {1: "bold", 2: "dim", 3: "italic", 4: "underline", 7: "inverse", 9: "strike"}
_UNSET = {21: ("bold", "dim"), 22: ("bold", "dim"), 23: ("italic",), 24: ("underline",), 27: ("inverse",), 29: ("strike",)}

BASIC = [
    "#24292f", "#cf222e", "#116329", "#4d2d00", "#0969da", "#8250df", "#1b7c83", "#6e7781",
    "#57606a", "#a40e26", "#1a7f37", "#633c01", "#218bff", "#a475f9", "#3192aa", "#8c959f",
]  # fmt: skip
_CUBE = [0, 95, 135, 175, 215, 255]


def _number(text: str) -> int | None:
    """A parameter's value: empty is 0 (as terminals read it), anything else not a number is None."""
    if not text:
        return 0
    return int(text) if text.isdigit() else None


def _rgb(values: list[str]) -> str | None:
    numbers = [_number(v) for v in values]
    if len(numbers) != 3 or any(n is None for n in numbers):
        return None
    return "#" + "".join(f"{max(0, min(255, n or 0)):02x}" for n in numbers)


def _colon_colour(sub: list[str]) -> int | str | None:
    """The colour of a colon-form ``38:5:n``, ``38:2::r:g:b`` (ITU T.416: a colour-space slot before
    r, g, b) or ``38:2:r:g:b`` (the slot left out, as many programs write it); ``sub`` is after 38."""
    kind = _number(sub[0]) if sub else None
    if kind == 5 and len(sub) >= 2:
        n = _number(sub[1])
        return n if n is not None and n <= 255 else None
    if kind == 2 and len(sub) >= 5:
        return _rgb(sub[2:5])
    if kind == 2 and len(sub) == 4:
        return _rgb(sub[1:4])
    return None


def apply_sgr(style: Style, params: str) -> Style:
    """The style after ``ESC [ params m`` on ``style`` (a new dict; ``style`` is not changed)."""
    out = dict(style)
    groups = params.split(";") if params else ["0"]
    i = 0
    while i < len(groups):
        group = groups[i]
        i += 1
        if ":" in group:  # a colon form carries its own sub-parameters, never the next groups
            sub = group.split(":")
            code = _number(sub[0])
            if code in (38, 48):
                colour = _colon_colour(sub[1:])
                if colour is not None:
                    out["fg" if code == 38 else "bg"] = colour
                continue
            if code == 4:  # 4:0 no underline, 4:1..4:5 one of its shapes
                out["underline"] = _number(sub[1]) != 0 if len(sub) > 1 else True
                continue
        else:
            code = _number(group)
        if code is None:
            continue
        if code == 0:
            out = {"reset": True}
        elif code in _SET:
            out[_SET[code]] = True
        elif code in _UNSET:
            for name in _UNSET[code]:
                out[name] = False
        elif 30 <= code <= 37 or 90 <= code <= 97:
            out["fg"] = code - 30 if code < 90 else code - 82
        elif 40 <= code <= 47 or 100 <= code <= 107:
            out["bg"] = code - 40 if code < 100 else code - 92
        elif code in (39, 49):
            out["fg" if code == 39 else "bg"] = False
        elif code in (38, 48):
            key = "fg" if code == 38 else "bg"
            kind = _number(groups[i]) if i < len(groups) else None
            if kind == 5 and i + 1 < len(groups):
                n = _number(groups[i + 1])
                if n is not None and n <= 255:
                    out[key] = n
                i += 2
            elif kind == 2 and i + 3 < len(groups):
                colour = _rgb(groups[i + 1 : i + 4])
                if colour is not None:
                    out[key] = colour
                i += 4
            else:
                break  # malformed: the rest is ignored, as terminals do
    return out


def style_after(text: str, style: Style | None = None) -> Style:
    """The style after every SGR sequence in ``text``, applied in order to ``style`` (default: none)."""
    out: Style = {} if style is None else style
    for match in SGR.finditer(text):
        out = apply_sgr(out, match.group(1))
    return out


def _colour_codes(base: int, colour: int | str) -> list[str]:
    """``base`` 30 (fg) or 40 (bg): the shortest codes for a palette index or ``#rrggbb``."""
    if isinstance(colour, str):
        return [str(base + 8), "2", str(int(colour[1:3], 16)), str(int(colour[3:5], 16)), str(int(colour[5:7], 16))]
    if colour < 8:
        return [str(base + colour)]
    if colour < 16:
        return [str(base + 60 + colour - 8)]
    return [str(base + 8), "5", str(colour)]


def sgr_params(style: Style) -> str:
    """The parameters that set the attributes ``style`` has on, in a fixed order (``"1;4;38;5;208"``):
    from no style, they give ``style``."""
    codes = [str(code) for name, code in _FLAGS.items() if style.get(name)]
    for key, base in (("fg", 30), ("bg", 40)):
        if style.get(key) not in (None, False):
            codes += _colour_codes(base, style[key])
    return ";".join(codes)


def sgr_sequence(change: Style) -> str:
    """One escape sequence with the effect of the codes that made ``change`` (see the module's doc);
    empty when they change nothing."""
    codes = ["0"] if change.get("reset") else []
    codes += sorted({str(_OFF[name]) for name, value in change.items() if value is False and name in _OFF})
    on = sgr_params(change)
    if on:
        codes.append(on)
    return f"\x1b[{';'.join(codes)}m" if codes else ""


def colour_css(colour: int | str | bool | None) -> str | None:
    """A palette index (the 16 basic colours, the 6×6×6 cube, the greys) or ``#rrggbb`` as CSS."""
    if colour is None or colour is False or colour is True:
        return None
    if isinstance(colour, str):
        return f"rgb({int(colour[1:3], 16)},{int(colour[3:5], 16)},{int(colour[5:7], 16)})"
    if colour < 16:
        return BASIC[colour]
    if colour < 232:
        n = colour - 16
        return f"rgb({_CUBE[n // 36]},{_CUBE[n // 6 % 6]},{_CUBE[n % 6]})"
    v = 8 + (colour - 232) * 10
    return f"rgb({v},{v},{v})"


def style_css(style: Style) -> str:
    """Inline CSS for a style (what ``labextension/src/lines.ts`` draws with classes and styles)."""
    fg, bg = colour_css(style.get("fg")), colour_css(style.get("bg"))
    if style.get("inverse"):
        fg, bg = bg or "var(--jp-layout-color0,#fff)", fg or "var(--jp-content-font-color1,#000)"
    css = []
    if fg:
        css.append(f"color:{fg}")
    if bg:
        css.append(f"background:{bg}")
    if style.get("bold"):
        css.append("font-weight:bold")
    if style.get("dim"):
        css.append("opacity:0.7")
    if style.get("italic"):
        css.append("font-style:italic")
    lines = [name for flag, name in (("underline", "underline"), ("strike", "line-through")) if style.get(flag)]
    if lines:
        css.append(f"text-decoration:{' '.join(lines)}")
    return ";".join(css)
