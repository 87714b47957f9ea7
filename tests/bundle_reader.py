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
