"""Read a frozen run's per-rank output back from its ``text/html`` (docs/run-bundle.md, section 4),
as the JupyterLab renderer does, so tests check what a saved notebook really holds."""

from __future__ import annotations

import html
import json
from dataclasses import dataclass, field
from html.parser import HTMLParser


@dataclass
class RankOutput:
    lines: list[tuple[str, str]] = field(default_factory=list)  # (stdout|stderr, text with its "\n")
    displays: list[dict] = field(default_factory=list)  # {"mime", "attrs", "html"} in order
    order: list[tuple[str, object]] = field(default_factory=list)  # ("line", (stream, text)) / ("display", dict)
    elided: int = 0

    def text(self, stream: str | None = None) -> str:
        return "".join(t for s, t in self.lines if stream is None or s == stream)


class _Reader(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ranks: dict[int, RankOutput] = {}
        self.rank: int | None = None
        self.depth = 0  # <div> depth inside the current output div
        self.line: list[str] | None = None  # [stream, text]
        self.span_depth = 0
        self.display: dict | None = None
        self.display_depth = 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if self.rank is None:
            if tag == "div" and "nbspawn-output" in (a.get("class") or "").split():
                self.rank, self.depth = int(a["data-rank"]), 1
                self.ranks[self.rank] = RankOutput()
            return
        out = self.ranks[self.rank]
        if tag == "div":
            self.depth += 1
            if "data-elided" in a:
                out.elided = int(a["data-elided"])
            elif "data-display" in a and self.display is None:
                self.display = {"mime": a["data-display"], "attrs": a, "html": ""}
                self.display_depth = self.depth
                if "data-widget" in a:
                    self.display["widget"] = json.loads(a["data-widget"])
                out.displays.append(self.display)
                out.order.append(("display", self.display))
                return
        if self.display is not None:
            self.display["html"] += self.get_starttag_text() or ""
            if tag == "img":
                self.display["src"] = a.get("src")
            return
        if tag == "span":
            if self.line is None and "data-s" in a:
                self.line = ["stderr" if a["data-s"] == "e" else "stdout", ""]
                self.span_depth = 1
            elif self.line is not None:
                self.span_depth += 1

    def handle_endtag(self, tag):
        if self.rank is None:
            return
        if self.display is not None and not (tag == "div" and self.depth == self.display_depth):
            self.display["html"] += f"</{tag}>"
            if tag == "div":
                self.depth -= 1
            return
        if tag == "div":
            if self.display is not None:
                self.display = None
            self.depth -= 1
            if self.depth == 0:
                self.rank = None
        elif tag == "span" and self.line is not None:
            self.span_depth -= 1
            if self.span_depth == 0:
                out = self.ranks[self.rank]
                out.lines.append((self.line[0], self.line[1]))
                out.order.append(("line", (self.line[0], self.line[1])))
                self.line = None

    def handle_data(self, data):
        if self.rank is None:
            return
        if self.display is not None:
            self.display["html"] += html.escape(data, quote=False)
            self.display.setdefault("text", "")
            self.display["text"] += data
        elif self.line is not None:
            self.line[1] += data


def rank_outputs(page: str) -> dict[int, RankOutput]:
    """Each rank's output in a frozen bundle's text/html."""
    reader = _Reader()
    reader.feed(page)
    reader.close()
    return reader.ranks


class _Order(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.order: str | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if self.order is None and tag == "div" and "nbspawn-run" in (a.get("class") or "").split():
            self.order = a.get("data-order")


def merged_entries(page: str) -> list[tuple[int, tuple[str, object]]]:
    """The merged view of a frozen bundle, as the JupyterLab renderer draws it (``labextension/src/mime.ts``):
    every rank's entries (``RankOutput.order``) in the bundle's ``data-order``, or, in a bundle without
    one, by position (every rank's n-th entry together)."""
    ranks = rank_outputs(page)
    reader = _Order()
    reader.feed(page)
    reader.close()
    if reader.order is None:
        longest = max((len(out.order) for out in ranks.values()), default=0)
        return [(r, ranks[r].order[i]) for i in range(longest) for r in sorted(ranks) if i < len(ranks[r].order)]
    merged, at = [], dict.fromkeys(ranks, 0)
    for run in reader.order.split(",") if reader.order else []:
        rank, _, count = run.partition("*")
        for _ in range(int(count or 1)):
            merged.append((int(rank), ranks[int(rank)].order[at[int(rank)]]))
            at[int(rank)] += 1
    assert all(at[r] == len(out.order) for r, out in ranks.items()), "data-order names every entry once"
    return merged


# -- what a saved snapshot must never hold (issue 30, item 2) ---------------------------------------

# rank HTML that could act in a trusted notebook reopened later; each piece with a visible word that
# stays, so a test sees the sanitizer kept the text and dropped the markup
HOSTILE_HTML = [
    '<a href="javascript:alert(1)">js-link</a>',
    '<a href="JaVaScRiPt&#58;alert(1)">js-entity-link</a>',
    '<a href="data:text/html,<script>alert(1)</script>">data-link</a>',
    '<meta http-equiv="refresh" content="0;url=https://example.invalid/">refresh',
    '<base href="https://example.invalid/">base',
    '<form action="https://example.invalid/"><input name="q"><button>form-button</button></form>',
    '<link rel="stylesheet" href="https://example.invalid/x.css">link',
    '<embed src="data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==">embed',
    '<span style="color:red;background:url(javascript:alert(1))">style-url</span>',
    '<span style="width:expression(alert(1))">style-expression</span>',
    '<span style="background:u\\72l(https://example.invalid/t.png)">style-escape</span>',
    "<script>alert(1)</script>script",
    '<img src="x" onerror="alert(1)">img-onerror',
    '<div onclick="alert(1)" onmouseover="alert(2)">div-onclick</div>',
    '<iframe src="https://example.invalid/"></iframe>iframe',
    '<object data="https://example.invalid/x.swf"></object>object',
    "<svg><script>alert(1)</script></svg>svg",
    '<span data-s="o" data-rank="7" class="nbspawn-output jp-Dialog">fake-line</span>',
    "</div></details></div>unbalanced",
]
# what stays shown: a DataFrame-like table, inline styles, a data: image, a safe link
SHOWN_HTML = (
    '<table border="1" class="dataframe"><thead><tr style="text-align: right;"><th>a</th></tr></thead>'
    '<tbody><tr><td style="color: rgb(1, 2, 3); font-weight: bold">42</td></tr></tbody></table>'
    '<pre style="white-space:pre;font-family:Menlo,monospace"><span style="color: #800000">rich</span></pre>'
    '<img src="data:image/png;base64,iVBORw0KGgo=" width="4"><a href="https://pytorch.org/">docs</a>'
)


class _Markup(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str]]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, {name: value or "" for name, value in attrs}))


def markup(page: str) -> list[tuple[str, dict[str, str]]]:
    """Every start tag in ``page``, with its attributes."""
    parser = _Markup()
    parser.feed(page)
    parser.close()
    return parser.tags


def acting_markup(page: str) -> list[str]:
    """What in ``page`` could act or reach out: elements that run, navigate, submit, fetch or frame,
    event handlers, ``javascript:``/``data:`` links, CSS functions that fetch or run."""
    found = []
    for tag, attrs in markup(page):
        if tag in {"script", "meta", "base", "form", "input", "button", "link", "embed", "iframe", "object", "svg", "style"}:
            found.append(f"<{tag}>")
        for name, value in attrs.items():
            lowered = value.lower().replace(" ", "")
            if name.startswith("on"):
                found.append(f"{tag} {name}")
            elif name in ("href", "src", "action") and (
                lowered.startswith(("javascript:", "vbscript:"))
                or (lowered.startswith("data:") and not (tag == "img" and lowered.startswith("data:image/")))
            ):
                found.append(f"{tag} {name}={value}")
            elif name == "style" and any(s in lowered for s in ("url(", "expression(", "\\", "javascript:")):
                found.append(f"{tag} style={value}")
    return found
