"""The collectives X-ray drawn (views._xray_html) from real analyses: the gloo ranks' records of
tests/unit/xray_records (a straggler, a mismatch, a hang) and runs built through the ranks' own record
(tests/xray_samples.py: 16 ranks x 10,000 collectives, NCCL's sends and receives).

The HTML is read back as a browser's parser would (html.parser: a tree of elements), and the marks
from the SVG's layers: each layer is one path whose marks are its ``M`` commands.  How it looks is
tests/browser/test_xray_view.py's.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from html.parser import HTMLParser

import pytest
from xray_samples import long_run, pipeline_run, records, sample

from nbspawn.events._xray import analyse, sentence
from nbspawn.views._bundle import json_size
from nbspawn.views._xray_html import LANE_H, MARK_W, MAX_MARKS, xray_html

VOID = {"br", "img", "meta", "input", "hr", "link"}


@dataclass
class Node:
    tag: str
    attrs: dict[str, str | None]
    children: list[Node | str] = field(default_factory=list)  # elements and text, in order

    def all(self, tag: str | None = None, **attrs: str) -> list[Node]:
        """Every element below (this one too) with ``tag`` whose attributes (``data_xray_layer`` for
        ``data-xray-layer``) have the values given (``...`` for any value)."""
        found = []
        wanted = {name.replace("_", "-"): value for name, value in attrs.items()}
        if (tag is None or self.tag == tag) and all(
            name in self.attrs and (value is ... or self.attrs[name] == value) for name, value in wanted.items()
        ):
            found.append(self)
        for child in self.children:
            if isinstance(child, Node):
                found += child.all(tag, **attrs)
        return found

    def one(self, tag: str | None = None, **attrs: str) -> Node:
        (found,) = self.all(tag, **attrs)
        return found

    def words(self) -> str:
        """Its text and its children's, titles left out."""
        return "".join(
            child if isinstance(child, str) else child.words() for child in self.children if getattr(child, "tag", "") != "title"
        )

    def title(self) -> str:
        return "".join(child.words() for child in self.children if isinstance(child, Node) and child.tag == "title")


class _Tree(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("root", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, dict(attrs))
        self.stack[-1].children.append(node)
        if tag not in VOID:
            self.stack.append(node)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.stack[-1].children.append(Node(tag, dict(attrs)))

    def handle_endtag(self, tag: str) -> None:
        assert self.stack[-1].tag == tag, f"</{tag}> closes <{self.stack[-1].tag}>: the HTML is not balanced"
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.stack[-1].children.append(data)


def tree(text: str) -> Node:
    parser = _Tree()
    parser.feed(text)
    parser.close()
    assert parser.stack == [parser.root], "an element is left open"
    return parser.root


MOVE = re.compile(r"M(-?[\d.]+) (-?[\d.]+)(?:v(\d+))?")


def marks(svg: Node, layer: str) -> list[tuple[float, float]]:
    """Each mark of a layer: its middle (a mark is a stroke ``M x y v height``, ``MARK_W`` wide)."""
    paths = svg.all("path", data_xray_layer=layer)
    if not paths:
        return []
    return [(float(x), float(y) + float(h or 0) / 2) for x, y, h in MOVE.findall(paths[0].attrs["d"] or "")]


def connectors(svg: Node) -> list[list[tuple[float, float]]]:
    """The lines that join a collective's marks, each a list of points (``M x y l dx dy dx dy ...``)."""
    found = []
    for start in re.findall(r"M[^M]+", svg.one("path", data_xray_layer="connector").attrs["d"] or ""):
        numbers = [float(n) for n in re.findall(r"-?[\d.]+", start)]
        points = [(numbers[0], numbers[1])]
        for dx, dy in zip(numbers[2::2], numbers[3::2], strict=True):
            points.append((points[-1][0] + dx, points[-1][1] + dy))
        found.append(points)
    return found


def lane_of(svg: Node, y: float) -> int:
    """The rank whose lane holds height ``y``."""
    for label in svg.all("text", data_xray_lane=...):
        if abs(float(label.attrs["y"] or 0) - 4 - y) < LANE_H / 2:
            return int(label.attrs["data-xray-lane"] or -1)
    raise AssertionError(f"no lane at y={y}")


def drawn(xray) -> tuple[Node, Node]:
    html = xray_html(xray)
    page = tree(html)
    return page.one("div", data_xray=...), page.one("svg", data_xray_lanes=...)


# -- the story: every kind of collective, a straggler, a mismatch ------------------------------------------


def test_a_lane_per_rank_and_a_mark_per_collective_on_each():
    xray = sample("story")
    view, svg = drawn(xray)
    assert [label.words() for label in svg.all("text", data_xray_lane=...)] == ["rank 0", "rank 1", "rank 2", "rank 3"]
    assert svg.attrs["data-xray-lanes"] == "4"
    everything = marks(svg, "arrival") + marks(svg, "last") + marks(svg, "mismatch")
    per_lane = {rank: sorted(x for x, y in everything if lane_of(svg, y) == rank) for rank in xray.ranks}
    assert {rank: len(xs) for rank, xs in per_lane.items()} == dict.fromkeys(xray.ranks, 18)
    # the marks of one collective are joined across the lanes, each lane's in turn
    centres = {(x, lane_of(svg, y)) for x, y in everything}
    lines = connectors(svg)
    assert len(lines) == 18
    for line in lines:
        assert [lane_of(svg, y) for _x, y in line] == [0, 1, 2, 3]
        assert all((x, lane_of(svg, y)) in centres for x, y in line)
    # and under a hover area that says what it was
    areas = svg.all("rect", data_xray_seq=...)
    assert [int(a.attrs["data-xray-seq"] or 0) for a in areas] == list(range(1, 19))
    for area, collective, line in zip(areas, xray.collectives, lines, strict=True):
        left, width = float(area.attrs["x"] or 0), float(area.attrs["width"] or 0)
        assert all(left <= x <= left + width for x, _y in line)
        assert area.title().startswith(f"{collective.op} #{collective.seq} (group default_pg)")
    assert "all_reduce #4 (group default_pg): [4, 8] Float\n128 B a rank\nrank 3 arrived last" in areas[3].title()
    assert "barrier #17 (group default_pg): no tensor" in areas[16].title()
    assert "Collectives" in view.one("div", data_xray_summary=...).words()


def test_the_last_arrival_is_drawn_apart_and_the_others_wait_for_it():
    xray = sample("story")
    _view, svg = drawn(xray)
    lasts = marks(svg, "last")
    assert len(lasts) == 18  # one a collective
    slept = [c for c in xray.collectives if 4 <= c.seq <= 13]  # rank 3 slept 30 ms before each
    assert sum(lane_of(svg, y) == 3 for _x, y in lasts) >= len(slept)
    waits = svg.one("path", data_xray_layer="wait").attrs["d"] or ""
    bars = [(float(x), float(y), float(w)) for x, y, w in re.findall(r"M(-?[\d.]+) (-?[\d.]+)h(-?[\d.]+)", waits)]
    lines = connectors(svg)
    for collective in slept:  # a bar from each other rank's mark to rank 3's
        line = lines[collective.seq - 1]
        late = line[3]
        for x, y in line[:3]:
            (bar,) = [(bx, bw) for bx, by, bw in bars if abs(bx - (x + MARK_W / 2)) <= 1 and by == y]
            assert abs(bar[0] + bar[1] - (late[0] - MARK_W / 2)) <= 1
            assert bar[1] > 20  # 30 ms is a long way on this axis


def test_the_stragglers_lane_says_so_and_each_lane_how_often_it_came_last():
    _view, svg = drawn(sample("story"))
    (straggler,) = svg.all("text", data_xray_straggler=...)
    assert straggler.attrs["data-xray-lane"] == "3"
    assert "straggler" in [t.words() for t in svg.all("text")]
    assert "last at 13" in [t.words() for t in svg.all("text")]
    _view, svg = drawn(sample("hang"))  # one collective all four entered: nobody to blame
    assert not svg.all("text", data_xray_straggler=...) and "straggler" not in svg.words()


def test_the_mismatch_is_red_on_its_collective_with_its_text():
    xray = sample("story")
    view, svg = drawn(xray)
    (mismatch,) = xray.mismatches
    (callout,) = svg.all("text", data_xray_problem="mismatch")
    assert callout.words() == "mismatch: " + mismatch.text
    (odd,) = marks(svg, "mismatch")
    assert lane_of(svg, odd[1]) == 1  # rank 1 called all_gather
    area = svg.one("rect", data_xray_seq="18")
    assert float(area.attrs["x"] or 0) <= odd[0] <= float(area.attrs["x"] or 0) + float(area.attrs["width"] or 0)
    assert mismatch.text in area.title()
    (band,) = marks(svg, "band")
    assert abs(band[0] - odd[0]) < 20
    # a sentence of its own in the summary, which begins with a capital (issue #57, item 10)
    assert "Rank 1 called all_gather" in sentence(mismatch.text)
    assert sentence(mismatch.text) in [d.words() for d in view.one("div", data_xray_summary=...).all("div")]


def test_a_hang_draws_the_ranks_that_entered_waiting_and_a_hollow_mark_for_the_one_that_never_came():
    xray = sample("hang")
    _view, svg = drawn(xray)
    (never,) = xray.never_entered
    (callout,) = svg.all("text", data_xray_problem="never")
    assert callout.words() == "hang: " + never.text == "hang: ranks 0, 1, 2 entered barrier #2; rank 3 never did"
    (ghost,) = marks(svg, "never")
    assert lane_of(svg, ghost[1] + 9) == 3
    barrier = svg.one("rect", data_xray_seq="2")
    left = float(barrier.attrs["x"] or 0)
    entered = [(x, y) for x, y in marks(svg, "arrival") + marks(svg, "last") if x >= left]
    assert sorted(lane_of(svg, y) for _x, y in entered) == [0, 1, 2]
    assert not [x for x, _y in marks(svg, "last") if x >= left]  # nobody came last: one never came
    waits = re.findall(r"M(-?[\d.]+) (-?[\d.]+)h(-?[\d.]+)", svg.one("path", data_xray_layer="wait").attrs["d"] or "")
    to_ghost = [(float(x) + float(w), lane_of(svg, float(y))) for x, y, w in waits if float(x) >= left]
    assert sorted(rank for _end, rank in to_ghost) == [0, 1, 2]
    assert all(abs(end - ghost[0]) <= 3 for end, _rank in to_ghost)
    assert "never" in [t.words() for t in svg.all("text")]
    assert never.text in barrier.title()


def test_sends_and_receives_are_arrows_from_the_senders_lane_to_the_receivers():
    xray = pipeline_run()
    assert [(p.src, p.dst) for p in xray.pairs] == [(0, 1), (1, 2), (2, 3)]
    _view, svg = drawn(xray)
    lines = re.findall(r"M(-?[\d.]+) (-?[\d.]+)L(-?[\d.]+) (-?[\d.]+)", svg.one("path", data_xray_layer="pair").attrs["d"] or "")
    assert [(lane_of(svg, float(y1)), lane_of(svg, float(y2))) for _x1, y1, _x2, y2 in lines] == [(0, 1), (1, 2), (2, 3)]
    assert all(float(x2) > float(x1) for x1, _y1, x2, _y2 in lines)  # received 0.4 ms after the send
    heads = (svg.one("path", data_xray_layer="pair-head").attrs["d"] or "").count("M")
    assert heads == 3
    titles = [p.title() for p in svg.all("path") if p.title()]
    assert "send rank 0 → recv rank 1 [8, 16] (group 0); received 400 µs after the send" in titles
    assert len(svg.all("rect", data_xray_seq=...)) == 6


def test_the_time_axis_is_labelled_in_the_runs_units():
    _view, svg = drawn(sample("story"))  # 476 ms
    ticks = [t.words() for t in svg.all("text") if re.fullmatch(r"[\d.]+ (ms|s|µs)", t.words())]
    assert ticks[:2] == ["0 ms", "100 ms"] and "400 ms" in ticks
    _view, svg = drawn(sample("hang"))  # 3.4 ms
    ticks = [t.words() for t in svg.all("text") if re.fullmatch(r"[\d.]+ (ms|s|µs)", t.words())]
    assert ticks[0] == "0 ms" and "3.0 ms" in ticks
    assert "time since first arrival" in [t.words() for t in svg.all("text")]


def test_crowded_collectives_are_spread_so_each_shows():
    """#1-#3 came within 8 ms, #14-#18 within 23 ms, of 476: on a linear axis they would overlap."""
    _view, svg = drawn(sample("story"))
    firsts = sorted(min(x for x, _y in line) for line in connectors(svg))
    assert len(firsts) == 18
    assert all(b - a >= 17 for a, b in itertools.pairwise(firsts))


def test_the_legend_says_what_every_mark_drawn_means_and_the_codes_on_them():
    """Only the marks the drawing has (issue #57, item 4: a legend of arrows no cell drew sent a learner
    looking for them): the story (gloo) has a mismatch but no hang and no recorded send."""
    view, _svg = drawn(sample("story"))
    legend = view.one("div", data_xray_legend=...).words()
    for words in ("arrival", "last arrival", "wait", "mismatch"):
        assert words in legend
    assert "never entered" not in legend and "send → recv" not in legend, legend
    assert "AR all_reduce" in legend and "BAR barrier" in legend and "BC broadcast" in legend
    hang = drawn(sample("hang"))[0].one("div", data_xray_legend=...).words()
    assert "never entered" in hang and "mismatch" not in hang and "send → recv" not in hang, hang
    pipeline = drawn(pipeline_run())[0].one("div", data_xray_legend=...).words()
    assert "send → recv" in pipeline and "never entered" not in pipeline, pipeline


# -- saved-notebook safe -----------------------------------------------------------------------------------


HOSTILE_OP = '<script>alert("op")</script>'
HOSTILE_GROUP = '"><img src=x onerror=alert(1)><svg onload=alert(2)>'


def test_op_and_group_names_are_text_never_markup():
    story = records("story")
    for rank, record in story.items():
        for entry in record["head"]:
            if entry["seq"] == 2:
                entry["op"] = HOSTILE_OP if rank != 2 else HOSTILE_OP + "&amp;"
            entry["group"] = HOSTILE_GROUP
    xray = analyse(story)
    html = xray_html(xray)
    page = tree(html)
    assert not page.all("script") and not page.all("img") and len(page.all("svg")) == 1 + 4  # the picture, 4 swatches
    for node in page.all():
        assert not [name for name in node.attrs if name.startswith("on")], node
    area = page.one("rect", data_xray_seq="2")
    assert area.title().startswith(f"{HOSTILE_OP} #2 (group {HOSTILE_GROUP})")
    first, _at_18 = page.all("text", data_xray_problem="mismatch")
    said = f"rank 2 called {HOSTILE_OP}&amp; [4, 8] where ranks 0, 1, 3 called {HOSTILE_OP} [4, 8] at #2 ({HOSTILE_GROUP})"
    assert first.title() == said  # the whole of it; shown, it is cut to the picture's width
    assert first.words().endswith("…") and said.startswith(first.words()[len("mismatch: ") : -1])
    assert HOSTILE_OP in page.one("div", data_xray_legend=...).words()


@pytest.mark.parametrize("name", ["story", "hang", "pipeline", "long"])
def test_static_inline_and_self_contained(name):
    xray = {"pipeline": pipeline_run, "long": long_run}.get(name, lambda: sample(name))()
    html = xray_html(xray)
    assert "<script" not in html.lower() and "<style" not in html.lower() and "<link" not in html.lower()
    assert re.findall(r"https?://[^\"' ]*", html) == ["http://www.w3.org/2000/svg"]  # the SVG's namespace only
    assert not re.search(r"\b(href|src)=|url\(|@import|<foreignobject|<iframe|<object|<embed", html, re.IGNORECASE)
    assert "id=" not in html  # nothing two outputs of a notebook could both claim
    tree(html)  # balanced


# -- bounded whatever the run's length ---------------------------------------------------------------------


def test_a_16_rank_run_of_10000_collectives_draws_within_its_budget():
    xray = long_run(16, 10_000)
    assert xray.count == 10_000 and xray.straggler == 5 and len(xray.collectives) == 513
    html = xray_html(xray)
    assert json_size(html) <= 60_000  # bytes as the notebook saves it: the budget (47.6 KB measured)
    view, svg = tree(html).one("div", data_xray=...), tree(html).one("svg", data_xray_lanes=...)
    areas = svg.all("rect", data_xray_seq=...)
    seqs = [int(a.attrs["data-xray-seq"] or 0) for a in areas]
    assert seqs == [*range(1, 33), *range(9969, 10001)] and len(seqs) == MAX_MARKS
    assert view.one("div", data_xray_shown=...).words() == "first 32 and last 32 of 10,000 collectives drawn"
    (gap,) = svg.all("g", data_xray_gap=...)
    assert gap.attrs["data-xray-gap"] == "9936" and "9,936 more" in gap.words()
    assert svg.all("text", data_xray_problem="mismatch") and svg.all("text", data_xray_problem="never")
    assert svg.one("text", data_xray_straggler=...).attrs["data-xray-lane"] == "5"
    assert len(marks(svg, "arrival") + marks(svg, "last") + marks(svg, "mismatch")) == 64 * 16 - 1  # #10000: 15 came


def test_what_went_wrong_in_the_middle_is_drawn_between_the_first_and_the_last():
    xray = sample("story")
    view, svg = drawn_with(xray, max_marks=6)
    seqs = [int(a.attrs["data-xray-seq"] or 0) for a in svg.all("rect", data_xray_seq=...)]
    assert seqs == [1, 2, 3, 16, 17, 18]
    assert view.one("div", data_xray_shown=...).words() == "first 3 and last 3 of 18 collectives drawn"
    story = records("story")  # the mismatch moved to #9, in the middle
    for record in story.values():
        for entry in record["head"]:
            if entry["seq"] == 18:
                entry["op"] = "all_reduce"
            if entry["seq"] == 9 and record["rank"] == 2:
                entry["op"] = "broadcast"
    view, svg = drawn_with(analyse(story), max_marks=6)
    seqs = [int(a.attrs["data-xray-seq"] or 0) for a in svg.all("rect", data_xray_seq=...)]
    assert seqs == [1, 2, 3, 9, 16, 17, 18]
    assert [g.attrs["data-xray-gap"] for g in svg.all("g", data_xray_gap=...)] == ["5", "6"]
    assert "rank 2 called broadcast [4, 8]" in svg.one("text", data_xray_problem="mismatch").words()


def test_many_ranks_draw_fewer_collectives_each():
    xray = long_run(64, 600, slow=5, odd=9, absent=7)
    html = xray_html(xray)
    svg = tree(html).one("svg", data_xray_lanes=...)
    assert svg.attrs["data-xray-lanes"] == "64"
    assert len(svg.all("rect", data_xray_seq=...)) <= 16 + 2  # 1,024 marks, and the two that went wrong
    assert json_size(html) <= 60_000


def drawn_with(xray, **options) -> tuple[Node, Node]:
    page = tree(xray_html(xray, **options))
    return page.one("div", data_xray=...), page.one("svg", data_xray_lanes=...)
