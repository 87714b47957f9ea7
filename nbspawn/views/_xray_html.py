"""The collectives X-ray drawn: what the ranks did together, as static HTML with an inline SVG (issue #43).

Pure: it takes an :class:`~nbspawn.events._xray.XRay` and returns HTML; the same text goes in the frozen
snapshot saved with the notebook and in the live widget.  So, as ``_bundle`` does, it holds no
script, fetches nothing, takes no stylesheet (nbconvert and GitHub drop them: inline styles only), and
escapes every byte a rank or torch named (ops, groups); its colours are JupyterLab's variables with a
light fallback, so it reads in the light and the dark theme and where there is no JupyterLab.

What it draws, top to bottom:

* the summary in words (``XRay.summary``), and, for a long run, how much of it is drawn;
* a callout per thing that went wrong, in red, above the collective it happened at: a mismatch
  (its collective's band and the odd ranks' marks red) and a collective some ranks never entered
  (the ranks that did wait on, up to a hollow, dashed mark on the lane of each rank that never came);
* one lane per rank on a shared time axis (since the first arrival, in µs, ms or s), one mark per
  collective per rank at its arrival, the marks of one collective joined by a thin line across the
  lanes, the last arrival (the one the others waited for) taller and orange, and a faint bar from
  each other rank's arrival to it: its wait.  Hovering anywhere on a collective tells its op, group,
  sequence number, shapes, dtypes, bytes, who came last and each rank's wait (an SVG ``<title>``).
  The straggler's lane is labelled so; each lane says at how many collectives its rank came last;
* point-to-point pairs as arrows from the send's lane to the receive's;
* a legend, with the op codes written on the marks (``AR`` all_reduce) where there is room.

The time axis is linear between collectives but never narrower than a mark between two of them:
where collectives crowd (three all_reduces in a millisecond, then one 30 ms late) the crowded spot is
stretched so each shows, and its ticks still say the true times.

Bounded whatever the run's length: at most ``max_marks`` collectives are drawn (fewer with many
ranks: :data:`MARK_BUDGET` marks in all), the first half and the last half, plus those where
something went wrong; what lies between is a break in the axis that says how many it hides.  A
16-rank run of 10,000 collectives draws in 48 KB as the notebook saves it, a 64-rank one in 46 KB, a
4-rank one in 31 KB (the issue's budget: 60 KB; tests/unit/test_unit_xray_html.py), in ~3 ms.
"""

from __future__ import annotations

import bisect
import html
import itertools
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ..events._xray import Collective, Mismatch, NeverEntered, XRay, ran_text, sentence
from ._xray_values_html import values_html

VERSION = 1  # data-xray: the drawing's version, for a renderer that reads it
MAX_MARKS = 64  # collectives drawn at most
MARK_BUDGET = 1024  # marks (collectives x ranks) drawn at most: fewer collectives for many ranks
MIN_COLLECTIVES = 8  # but never fewer collectives than this
MAX_CALLOUTS = 4  # things that went wrong written above the lanes; the summary says every one

# geometry, in SVG pixels
WIDTH = 960
LABEL_W = 132  # the lane labels
RIGHT_W = 78  # "last at 13"
LANE_H = 24
MARK_W = 5
MARK_H = 12
LAST_H = 18
GAP_W = 46  # a break in the axis: collectives not drawn
GHOST_W = 56  # the column of the collective some ranks never entered
CALLOUT_H = 16
CODE_H = 14
AXIS_H = 26
MIN_SPACING = 18  # between two collectives' first arrivals: a mark and its op code
CHAR_W = 6.4  # a character of 11px sans-serif, generously: to keep text inside the picture
TICK_EVERY = 90  # pixels between time labels, about

# colours: JupyterLab's variables where a theme has one, a light fallback elsewhere
TEXT = "var(--jp-ui-font-color1,#1f2328)"
TEXT2 = "var(--jp-ui-font-color2,#57606a)"
LINE = "var(--jp-ui-font-color3,#8c959f)"
LANE_BG = "var(--jp-layout-color2,#eef1f4)"
ARRIVAL = "var(--jp-brand-color1,#1976d2)"
LAST = "#ef6c00"  # orange reads on white and on JupyterLab's dark grey alike
ERROR = "var(--jp-error-color1,#d32f2f)"
P2P = "#9c5fd4"  # a purple that reads on white and on dark grey

OP_CODES = {
    "all_reduce": "AR",
    "allreduce": "AR",
    "all_reduce_coalesced": "ARc",
    "allreduce_coalesced": "ARc",
    "broadcast": "BC",
    "all_gather": "AG",
    "allgather": "AG",
    "all_gather_into_tensor": "AG",
    "_allgather_base": "AG",
    "allgather_into_tensor_coalesced": "AGc",
    "reduce_scatter": "RS",
    "reduce_scatter_tensor": "RS",
    "_reduce_scatter_base": "RS",
    "reduce_scatter_tensor_coalesced": "RSc",
    "reduce": "R",
    "gather": "G",
    "scatter": "S",
    "all_to_all": "A2A",
    "alltoall": "A2A",
    "alltoall_base": "A2A",
    "all_to_all_single": "A2A",
    "barrier": "BAR",
    "coalesced": "C",
}


def xray_html(xray: XRay, *, max_marks: int = MAX_MARKS, width: int = WIDTH) -> str:
    """The X-ray as static HTML: the summary, an inline SVG of the ranks' lanes, a legend."""
    drawn, gaps = _choose(xray, max_marks)
    svg = _Picture(xray, drawn, gaps, width).svg()
    shown = (
        f"first {len(drawn[0])} and last {sum(len(seg) for seg in drawn[1:])} of {xray.count:,} collectives drawn"
        if len(drawn) > 1
        else ""
    )
    parts = [
        f'<div class="nbspawn-xray" data-xray="{VERSION}" style="font-family:var(--jp-ui-font-family,sans-serif);'
        f'font-size:13px;color:{TEXT};margin:4px 0">',
        _summary_html(xray),
    ]
    if shown:
        parts.append(f'<div data-xray-shown style="color:{TEXT2};font-size:12px">{_e(shown)}</div>')
    # --xray values: each collective's small tensors before and after, under the lanes, in the same div
    # (the page's renderer takes the div.nbspawn-xray whole)
    parts += [svg, _legend(xray, drawn), values_html(xray.values, xray.values_beyond), "</div>"]
    return "".join(parts)


def _summary_html(xray: XRay) -> str:
    """The summary in words, a sentence a line: what went wrong in red, the notes after it in grey."""
    rest = xray.summary
    lines: list[tuple[str, str]] = []
    for text in [m.text for m in xray.mismatches] + [n.text for n in xray.never_entered]:
        text = sentence(text)  # as the summary says it
        at = rest.find(text)
        if at < 0:
            continue
        lines += [(rest[:at], ""), (text, ERROR)]
        rest = rest[at + len(text) :]
    lines.append((rest, ""))
    out: list[str] = []
    for text, colour in lines:
        text = text.strip().strip(".").strip()
        if not text:
            continue
        if not out:
            out.append(f"<div><b>Collectives</b> &middot; {_e(text)}</div>")
        elif colour:
            out.append(f'<div style="color:{colour};font-weight:bold">{_e(text)}</div>')
        else:
            out.append(f'<div style="color:{TEXT2}">{_e(text)}</div>')
    return f"<div data-xray-summary>{''.join(out)}</div>"


# -- what is drawn --------------------------------------------------------------------------------------


def _choose(xray: XRay, max_marks: int) -> tuple[list[list[Collective]], list[int]]:
    """The collectives drawn, as segments of consecutive ones, and how many each break between two
    segments hides: the first and the last of the run, and every one where something went wrong."""
    collectives = list(xray.collectives)
    cap = max(1, min(max_marks, max(MIN_COLLECTIVES, MARK_BUDGET // max(1, len(xray.ranks)))))
    if len(collectives) <= cap:
        chosen = list(range(len(collectives)))
    else:
        wrong = _problem_keys(xray)
        half = cap // 2
        chosen = sorted(
            {*range(half), *range(len(collectives) - (cap - half), len(collectives))}
            | {i for i, c in enumerate(collectives) if (c.pg, c.seq) in wrong}
        )
    segments: list[list[Collective]] = []
    gaps: list[int] = []
    previous: int | None = None
    for index in chosen:
        collective = collectives[index]
        hidden = 0
        if previous is not None:
            before = collectives[previous]
            hidden = index - previous - 1
            if before.pg == collective.pg:
                hidden = max(hidden, collective.seq - before.seq - 1)
        if previous is None or hidden > 0:
            if previous is not None:
                gaps.append(hidden)
            segments.append([])
        segments[-1].append(collective)
        previous = index
    return segments, gaps


def _problem_keys(xray: XRay) -> set[tuple[str, int]]:
    return {(m.pg, m.seq) for m in xray.mismatches} | {(n.pg, n.seq) for n in xray.never_entered}


# -- the time axis --------------------------------------------------------------------------------------


@dataclass
class _Segment:
    """A stretch of the axis: time -> x, linear between its collectives, stretched where they crowd."""

    x0: float
    x1: float
    times: list[int]  # the breakpoints: each collective's first arrival (and a pair's send), then the end
    xs: list[float]

    @classmethod
    def fit(cls, x0: float, x1: float, points: Sequence[int], end: int) -> _Segment:
        times = sorted(set(points) | {end})
        room = x1 - x0 - MARK_W
        if len(times) == 1:
            return cls(x0, x1, times, [x0 + room / 2])
        spans = [b - a for a, b in itertools.pairwise(times)]
        least = min(MIN_SPACING, room / len(spans))
        scale = _scale_for(spans, least, room)
        xs = [x0]
        for span in spans:
            xs.append(xs[-1] + max(span * scale, least))
        return cls(x0, x1, times, xs)

    def x(self, t: int) -> float:
        i = bisect.bisect_right(self.times, t) - 1
        if i < 0:
            return self.xs[0]
        if i >= len(self.times) - 1:
            return self.xs[-1]
        t0, t1 = self.times[i], self.times[i + 1]
        return self.xs[i] + (self.xs[i + 1] - self.xs[i]) * (t - t0) / (t1 - t0)

    def holds(self, t: int) -> bool:
        return self.times[0] <= t <= self.times[-1]


def _scale_for(spans: Sequence[int], least: float, room: float) -> float:
    """Pixels a nanosecond such that the spans, each at least ``least`` wide, fill ``room``."""
    total = sum(spans)
    if total <= 0 or least * len(spans) >= room:
        return 0.0
    low, high = 0.0, room / total
    for _ in range(50):
        mid = (low + high) / 2
        if sum(max(span * mid, least) for span in spans) > room:
            high = mid
        else:
            low = mid
    return low


def _nice_step(span_s: float, count: float) -> float:
    raw = span_s / max(1.0, count)
    if raw <= 0:
        return 0.0
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def _time_text(seconds: float, step: float) -> str:
    if step >= 1 or seconds >= 10:
        unit, scale = "s", 1.0
    elif step >= 1e-4:
        unit, scale = "ms", 1e3
    else:
        unit, scale = "µs", 1e6
    value = seconds * scale
    if abs(value) < 1e-9:
        return f"0 {unit}"
    digits = max(0, -math.floor(math.log10(step * scale) + 1e-9)) if step * scale < 1 else 0
    return f"{value:.{digits}f} {unit}"


def _duration(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.0f} µs"


# -- the picture ----------------------------------------------------------------------------------------


@dataclass
class _Layers:
    """The drawing's layers, filled collective by collective (``_Picture.svg``): path data a layer each,
    hover targets and op codes as elements, and where the last code drawn ends (codes never overlap)."""

    waits: list[str] = field(default_factory=list)
    connectors: list[str] = field(default_factory=list)
    marks: list[str] = field(default_factory=list)
    lasts: list[str] = field(default_factory=list)
    odd: list[str] = field(default_factory=list)
    bands: list[str] = field(default_factory=list)
    ghosts: list[str] = field(default_factory=list)
    hovers: list[str] = field(default_factory=list)
    codes: list[str] = field(default_factory=list)
    code_right: float = -1e9


class _Picture:
    """The SVG: its layers gathered as paths (one a kind, not one an element: a 10,000-collective run
    stays small), then each collective's hover area with its words."""

    def __init__(self, xray: XRay, drawn: list[list[Collective]], gaps: list[int], width: int) -> None:
        self.xray = xray
        self.drawn = drawn
        self.gaps = gaps
        self.width = width
        self.lanes = {rank: i for i, rank in enumerate(xray.ranks)}
        self.mismatches = {(m.pg, m.seq): m for m in xray.mismatches}
        self.never = {(n.pg, n.seq): n for n in xray.never_entered}
        arrivals = [a.created_ns for seg in drawn for c in seg for a in c.arrivals]
        self.t0 = min(arrivals, default=min((p.send_ns for p in xray.pairs), default=0))
        self.callouts: list[tuple[float, str, str, str]] = []  # (x, kind, text shown, its whole text)
        self._layout()

    # geometry

    def _layout(self) -> None:
        problems = len(self.mismatches) + len(self.never)
        self.top = 4 + CALLOUT_H * min(problems, MAX_CALLOUTS) + CODE_H
        self.lanes_top = self.top
        self.lanes_bottom = self.top + LANE_H * len(self.xray.ranks)
        self.height = self.lanes_bottom + AXIS_H
        x0, x1 = LABEL_W + 8, self.width - RIGHT_W - 8
        ghost = GHOST_W if self.never else 0
        room = x1 - x0 - ghost - GAP_W * len(self.gaps)
        sizes = [max(1, len(seg)) for seg in self.drawn] or [1]
        self.segments: list[_Segment] = []
        pair_times = [p.send_ns for p in self.xray.pairs]
        x = float(x0)
        for k, seg in enumerate(self.drawn):
            share = room * sizes[k] / sum(sizes)
            firsts = [min(a.created_ns for a in c.arrivals) for c in seg]
            last = max(a.created_ns for c in seg for a in c.arrivals)
            start = min(firsts)
            if k == 0:
                start = min([start, *pair_times])
            if k == len(self.drawn) - 1:
                last = max([last, *(p.recv_ns for p in self.xray.pairs)])
            points = [*firsts, *(t for t in pair_times if start <= t <= last)]
            self.segments.append(_Segment.fit(x, x + share, [start, *points], last))
            x += share + GAP_W
        if not self.drawn and self.xray.pairs:
            times = [t for p in self.xray.pairs for t in (p.send_ns, p.recv_ns)]
            self.segments.append(_Segment.fit(x0, x1 - ghost, [*(p.send_ns for p in self.xray.pairs)], max(times)))
        self.plot = (x0, x1)
        self.ghost_x = x1 - ghost + (ghost - MARK_W) / 2

    def lane_y(self, rank: int) -> float:
        return self.lanes_top + LANE_H * self.lanes[rank] + LANE_H / 2

    def x(self, t: int) -> float:
        for seg in self.segments:
            if t <= seg.times[-1]:
                return seg.x(t)
        return self.segments[-1].x(t) if self.segments else self.plot[0]

    # drawing

    def svg(self) -> str:
        layers = _Layers()
        for seg_index, seg in enumerate(self.drawn):
            for collective in seg:
                self._draw(self.segments[seg_index], collective, layers)
        self._draw_never_entered(layers)
        out = [
            f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {self.width} {self.height}" width="{self.width}" '
            f'height="{self.height}" data-xray-lanes="{len(self.lanes)}" role="img" aria-label="collectives by rank over time" font-size="11" '
            'style="display:block;max-width:100%;height:auto;font-family:inherit;margin:4px 0">',
            self._lanes(),
            _path("band", layers.bands, f"fill:{ERROR};fill-opacity:0.12"),
            _path("wait", layers.waits, f"stroke:{LAST};stroke-opacity:0.35;stroke-width:6;fill:none"),
            _path("connector", layers.connectors, f"stroke:{LINE};stroke-width:1;fill:none"),
            _path("arrival", layers.marks, f"stroke:{ARRIVAL};stroke-width:{MARK_W}"),
            _path("last", layers.lasts, f"stroke:{LAST};stroke-width:{MARK_W}"),
            _path("mismatch", layers.odd, f"stroke:{ERROR};stroke-width:{MARK_W}"),
            _path("never", layers.ghosts, f"fill:{ERROR};fill-opacity:0.12;stroke:{ERROR};stroke-width:1.5;stroke-dasharray:3 2"),
            self._ghost_label(),
            self._pairs(),
            self._axis(),
            self._gaps(),
            self._callouts(),
        ]
        if layers.codes:
            out.append(f'<g style="fill:{TEXT2}" font-size="10">{"".join(layers.codes)}</g>')
        if layers.hovers:
            out.append(f'<g style="fill:transparent">{"".join(layers.hovers)}</g>')
        out.append("</svg>")
        return "".join(out)

    def _draw(self, segment: _Segment, collective: Collective, layers: _Layers) -> None:
        """One collective: each rank's arrival, the waits for the last, what joins them, its hover, its code."""
        key = (collective.pg, collective.seq)
        mismatch, never = self.mismatches.get(key), self.never.get(key)
        xs = {a.rank: segment.x(a.created_ns) for a in collective.arrivals if a.rank in self.lanes}
        if not xs:
            return
        odd_ranks = {r for ranks, _call in (mismatch.calls[1:] if mismatch else ()) for r in ranks}
        last = None if never else collective.last
        end_x = self.ghost_x if never else (xs[last] if last is not None else None)
        for rank, x in xs.items():
            y = self.lane_y(rank)
            if end_x is not None and rank != last and end_x - x > 1:
                layers.waits.append(f"M{x + MARK_W:.0f} {y:.0f}h{end_x - x - MARK_W:.0f}")
            if rank in odd_ranks:
                layers.odd.append(_tick(x, y, LAST_H))
            elif rank == last:
                layers.lasts.append(_tick(x, y, LAST_H))
            else:
                layers.marks.append(_tick(x, y, MARK_H))
        if len(xs) > 1:
            points = sorted(xs.items(), key=lambda item: self.lanes[item[0]])
            layers.connectors.append(_polyline([(x + MARK_W / 2, self.lane_y(rank)) for rank, x in points]))
        left, right = min(xs.values()), max(xs.values()) + MARK_W
        if mismatch or never:
            band_right = self.ghost_x + MARK_W if never else right
            layers.bands.append(f"M{left - 3:.0f} {self.lanes_top}H{band_right + 3:.0f}V{self.lanes_bottom}H{left - 3:.0f}z")
            self._callout(left, right, mismatch, never)
        ranks = [self.lanes[r] for r in xs]
        top, bottom = self.lanes_top + LANE_H * min(ranks), self.lanes_top + LANE_H * (max(ranks) + 1)
        layers.hovers.append(
            f'<rect data-xray-seq="{collective.seq}" x="{left - 2:.0f}" y="{top}" width="{right - left + 4:.0f}" '
            f'height="{bottom - top}">'
            f"<title>{_e(_describe(collective, mismatch, never))}</title></rect>"
        )
        code = _op_code(collective.op) + ("≠" if mismatch else "")
        if (mismatch or never) and layers.codes and left < layers.code_right + 2:
            layers.codes.pop()  # the code of what went wrong before its neighbour's
            layers.code_right = -1e9
        if left >= layers.code_right + 2:
            red = f' style="fill:{ERROR};font-weight:bold"' if mismatch or never else ""
            layers.codes.append(f'<text x="{left:.0f}" y="{self.top - 3}"{red}>{_e(code)}</text>')
            layers.code_right = left + CHAR_W * len(code)

    def _draw_never_entered(self, layers: _Layers) -> None:
        """Collectives some ranks never entered: a ghost mark on each absent rank's lane, and a callout
        where the collective itself is not drawn (no rank's arrival falls in a drawn segment)."""
        for never in self.xray.never_entered:
            key = (never.pg, never.seq)
            if not any((c.pg, c.seq) == key for seg in self.drawn for c in seg):
                self._callout(self.ghost_x, self.ghost_x + MARK_W, None, never)
            for rank in never.absent:
                if rank in self.lanes:
                    layers.ghosts.append(
                        f"M{self.ghost_x - 2:.0f} {self.lane_y(rank) - LAST_H / 2:.0f}h{MARK_W + 4}v{LAST_H}h-{MARK_W + 4}z"
                    )

    def _lanes(self) -> str:
        backgrounds = []
        labels = []
        right = []
        x0, x1 = self.plot
        for rank, lane in self.lanes.items():
            y = self.lanes_top + LANE_H * lane
            if lane % 2 == 0:
                backgrounds.append(f"M{x0 - 4} {y}H{x1 + 4}v{LANE_H}H{x0 - 4}z")
            mid = y + LANE_H / 2 + 4
            if rank == self.xray.straggler:
                badge_w = 58
                labels.append(
                    f'<rect x="{LABEL_W - 40 - badge_w - 6}" y="{mid - 12}" width="{badge_w}" height="15" rx="7" '
                    f'style="fill:{LAST}"/><text x="{LABEL_W - 40 - badge_w / 2 - 6:.0f}" y="{mid - 1}" '
                    f'text-anchor="middle" font-size="10" style="fill:#fff;font-weight:bold">straggler</text>'
                )
                labels.append(
                    f'<text data-xray-lane="{rank}" data-xray-straggler="1" x="{LABEL_W}" y="{mid}" text-anchor="end" '
                    f'style="fill:{LAST};font-weight:bold">rank {rank}</text>'
                )
            else:
                labels.append(f'<text data-xray-lane="{rank}" x="{LABEL_W}" y="{mid}" text-anchor="end">rank {rank}</text>')
            count = self.xray.last_at.get(rank, 0)
            if count:
                late = self.xray.mean_late_s.get(rank, 0.0)
                right.append(
                    f'<text x="{x1 + 10}" y="{mid}"><title>rank {rank} arrived last at {count} collective'
                    f"{'s' if count != 1 else ''}, {_duration(late)} after the others on average</title>"
                    f"last at {count}</text>"
                )
        return (
            _path("lane", backgrounds, f"fill:{LANE_BG};fill-opacity:0.6")
            + f'<g style="fill:{TEXT}">{"".join(labels)}</g>'
            + f'<g style="fill:{TEXT2}" font-size="10">{"".join(right)}</g>'
        )

    def _axis(self) -> str:
        y = self.lanes_bottom + 2
        ticks, labels = [], []
        for k, segment in enumerate(self.segments):
            start, end = segment.times[0], segment.times[-1]
            span_s = (end - start) / 1e9
            width = segment.xs[-1] - segment.xs[0]
            step = _nice_step(span_s, width / TICK_EVERY) if span_s > 0 else 0.0
            shown_right = -1e9
            last = k == len(self.segments) - 1
            bound = (self.ghost_x - 20 if self.never else self.plot[1] + RIGHT_W) if last else segment.x1 + 4
            values = [start / 1e9 - self.t0 / 1e9] if step == 0 else []
            if step:
                first = math.ceil((start - self.t0) / 1e9 / step - 1e-9) * step
                value = first
                while value <= (end - self.t0) / 1e9 + 1e-12:
                    values.append(value)
                    value += step
            for value in values:
                x = segment.x(self.t0 + round(value * 1e9)) + MARK_W / 2
                text = _time_text(value, step or max(value, 1e-6))
                half = CHAR_W * len(text) / 2
                if x - half < max(shown_right + 8, LABEL_W - 8 if k == 0 else segment.x0 - 4) or x + half > bound:
                    continue
                ticks.append(f"M{x:.0f} {y}v4")
                labels.append(f'<text x="{x:.0f}" y="{y + 15}" text-anchor="middle">{_e(text)}</text>')
                shown_right = x + half
        axis = "".join(f"M{s.x0:.0f} {y}H{s.x1:.0f}" for s in self.segments)
        return (
            _path("axis", [axis, *ticks], f"stroke:{LINE};stroke-width:1;fill:none")
            + f'<g style="fill:{TEXT2}" font-size="10">{"".join(labels)}'
            + f'<text x="{LABEL_W - 12}" y="{y + 15}" text-anchor="end">time since first arrival</text></g>'
        )

    def _gaps(self) -> str:
        out = []
        for k, hidden in enumerate(self.gaps):
            left, right = self.segments[k], self.segments[k + 1]
            mid = (left.x1 + right.x0) / 2
            skipped = (right.times[0] - left.times[-1]) / 1e9
            words = f"{hidden:,} collective{'s' if hidden != 1 else ''} not drawn ({_duration(max(0.0, skipped))})"
            height = self.lanes_bottom - self.lanes_top
            said = f"{hidden:,} more" if CHAR_W * len(f"{hidden:,} more") < height - 8 else _short_count(hidden)
            middle = (self.lanes_top + self.lanes_bottom) / 2
            out.append(
                f'<g data-xray-gap="{hidden}"><title>{_e(words)}</title><rect x="{mid - GAP_W / 2 + 6:.0f}" y="{self.lanes_top}" width="{GAP_W - 12}" '
                f'height="{height}" style="fill:{LINE};fill-opacity:0.15"/>'
                f'<text x="{mid:.0f}" y="{middle:.0f}" transform="rotate(-90 {mid:.0f} {middle:.0f})" text-anchor="middle" '
                f'dy="4" font-size="10" style="fill:{TEXT2}">{_e(said)}</text></g>'
            )
        return "".join(out)

    def _ghost_label(self) -> str:
        if not self.never:
            return ""
        x = self.ghost_x + MARK_W / 2
        return (
            f'<text x="{x:.0f}" y="{self.lanes_bottom + 17}" text-anchor="middle" font-size="10" '
            f'style="fill:{ERROR};font-weight:bold">never</text>'
        )

    def _callout(self, left: float, right: float, mismatch: Mismatch | None, never: NeverEntered | None) -> None:
        text = mismatch.text if mismatch else never.text if never else ""
        kind = "mismatch" if mismatch else "never"
        self.callouts.append((left, kind, ("mismatch: " if mismatch else "hang: ") + text, text))

    def _callouts(self) -> str:
        out = []
        for row, (x, kind, text, full) in enumerate(self.callouts[:MAX_CALLOUTS]):
            y = 4 + CALLOUT_H * row + 11
            fits = int((self.width - 8) / CHAR_W)
            shown = text if len(text) <= fits else text[: fits - 1] + "…"
            width = CHAR_W * len(shown)
            anchor_x = min(max(x, 4.0), self.width - 4 - width)
            out.append(
                f'<text data-xray-problem="{kind}" x="{anchor_x:.0f}" y="{y}" style="fill:{ERROR};font-weight:bold"><title>{_e(full)}</title>'
                f"{_e(shown)}</text>"
                f'<path d="M{x + MARK_W / 2:.0f} {y + 3}V{self.top - CODE_H + 2}" style="stroke:{ERROR};stroke-width:1;'
                'stroke-dasharray:2 2"/>'
            )
        return "".join(out)

    def _pairs(self) -> str:
        pairs = list(self.xray.pairs)
        cap = max(MIN_COLLECTIVES, MARK_BUDGET // max(1, len(self.xray.ranks)))
        if len(pairs) > cap:
            pairs = pairs[: cap // 2] + pairs[-(cap - cap // 2) :]
        lines, heads, ends, hovers = [], [], [], []
        for pair in pairs:
            if pair.src not in self.lanes or pair.dst not in self.lanes:
                continue
            if not any(seg.holds(pair.send_ns) for seg in self.segments):
                continue
            x1, y1 = self.x(pair.send_ns) + MARK_W / 2, self.lane_y(pair.src)
            x2, y2 = self.x(pair.recv_ns) + MARK_W / 2, self.lane_y(pair.dst)
            lines.append(f"M{x1:.0f} {y1:.0f}L{x2:.0f} {y2:.0f}")
            heads.append(_arrow_head(x1, y1, x2, y2))
            ends += [_tick(x1 - MARK_W / 2, y1, MARK_H), _tick(x2 - MARK_W / 2, y2, MARK_H)]
            shapes = " ".join(str(list(s)) for s in pair.sizes)
            words = f"send rank {pair.src} → recv rank {pair.dst} {shapes} (group {pair.pg}); received {_duration(max(0, pair.recv_ns - pair.send_ns) / 1e9)} after the send"
            hovers.append(
                f'<path d="M{x1:.0f} {y1:.0f}L{x2:.0f} {y2:.0f}" style="stroke:transparent;stroke-width:8">'
                f"<title>{_e(words)}</title></path>"
            )
        if not lines:
            return ""
        return (
            _path("pair", lines, f"stroke:{P2P};stroke-width:1.5;fill:none")
            + _path("pair-end", ends, f"stroke:{P2P};stroke-width:{MARK_W}")
            + _path("pair-head", heads, f"fill:{P2P}")
            + f"<g>{''.join(hovers)}</g>"
        )


def _tick(x: float, y: float, height: int) -> str:
    """A mark whose left edge is at ``x``, centred on ``y``: a vertical stroke ``MARK_W`` wide (the
    fewest bytes a mark: a 16-rank run draws a thousand)."""
    return f"M{x + MARK_W / 2:.0f} {y - height / 2:.0f}v{height}"


def _polyline(points: Sequence[tuple[float, float]]) -> str:
    """A line through ``points``, each step relative to the last (``l2 24``: a lane down)."""
    x0, y0 = round(points[0][0]), round(points[0][1])
    steps = []
    for x, y in points[1:]:
        steps.append(f"{round(x) - x0} {round(y) - y0}")
        x0, y0 = round(x), round(y)
    return f"M{round(points[0][0])} {round(points[0][1])}l" + " ".join(steps)


def _path(layer: str, parts: Iterable[str], style: str) -> str:
    """One layer of like marks as a single path (``data-xray-layer`` names it)."""
    d = "".join(parts)
    return f'<path data-xray-layer="{layer}" d="{d}" style="{style}"/>' if d else ""


def _arrow_head(x1: float, y1: float, x2: float, y2: float) -> str:
    length = math.hypot(x2 - x1, y2 - y1) or 1.0
    ux, uy = (x2 - x1) / length, (y2 - y1) / length
    bx, by = x2 - 7 * ux, y2 - 7 * uy
    return f"M{x2:.0f} {y2:.0f}L{bx - 3.5 * uy:.1f} {by + 3.5 * ux:.1f}L{bx + 3.5 * uy:.1f} {by - 3.5 * ux:.1f}z"


def _describe(collective: Collective, mismatch: Mismatch | None, never: NeverEntered | None) -> str:
    """A collective's hover text: what it was, who came last, how long each other rank waited."""
    shapes = " ".join(str(list(s)) for s in collective.sizes) or "no tensor"
    dtypes = ", ".join(dict.fromkeys(d for a in collective.arrivals for d in a.dtypes))
    group = f"group {collective.group or collective.pg}"
    lines = [f"{collective.op} #{collective.seq} ({group}): {shapes}" + (f" {dtypes}" if dtypes else "")]
    if collective.ran:  # a call the backend ran as other collectives (issue #57, item 2)
        numbers = f"#{collective.seqs[0]}" if len(collective.seqs) == 1 else f"#{collective.seqs[0]}–#{collective.seqs[-1]}"
        lines.append(f"{collective.backend or 'the backend'} ran it as {ran_text(collective.ran)} (torch's {numbers})")
    lines.append(f"{_bytes_text(collective.bytes)} a rank")
    if mismatch:
        lines.append(mismatch.text)
    if never:
        lines.append(never.text)
    elif collective.last is not None:
        lines.append(f"rank {collective.last} arrived last, {_duration(max(0.0, collective.late_s))} after the others on average")
        if len(collective.waits_s) <= 8:
            waits = ", ".join(
                f"rank {rank} {_duration(wait)}" for rank, wait in sorted(collective.waits_s.items()) if rank != collective.last
            )
            lines.append(f"waited: {waits}")
    return "\n".join(lines)


def _legend(xray: XRay, drawn: list[list[Collective]]) -> str:
    """What each mark the drawing has means (only those: a legend of marks nowhere drawn sends a learner
    looking for them, issue #57), and the op codes on the marks; HTML, so it wraps in a narrow output."""

    def swatch(inner: str) -> str:
        return f'<svg width="22" height="16" viewBox="0 0 22 16" style="vertical-align:middle">{inner}</svg>'

    shown = [c for seg in drawn for c in seg]
    keys = {(c.pg, c.seq) for c in shown}
    has = {
        "arrival": bool(shown),
        "last": any(c.last is not None for c in shown),
        "mismatch": any((m.pg, m.seq) in keys for m in xray.mismatches),
        "never": bool(xray.never_entered),
        "pairs": bool(xray.pairs),
    }
    items = [
        (swatch(f'<rect x="8" y="2" width="{MARK_W}" height="{MARK_H}" style="fill:{ARRIVAL}"/>'), "arrival"),
        (
            swatch(f'<rect x="8" y="0" width="{MARK_W}" height="16" style="fill:{LAST}"/>'),
            "last arrival (the one the others waited for)",
        ),
        (swatch(f'<path d="M0 8H20" style="stroke:{LAST};stroke-opacity:0.35;stroke-width:6"/>'), "wait"),
        (
            swatch(f'<rect x="8" y="2" width="{MARK_W}" height="{MARK_H}" style="fill:{ERROR}"/>'),
            "mismatch (a different op or shape)",
        ),
        (
            swatch(
                f'<rect x="8" y="1" width="{MARK_W}" height="14" style="fill:none;stroke:{ERROR};stroke-width:1.5;'
                'stroke-dasharray:3 2"/>'
            ),
            "never entered",
        ),
        (
            swatch(
                f'<path d="M1 13L16 4" style="stroke:{P2P};stroke-width:1.5"/><path d="M20 2L13 3L16 8z" style="fill:{P2P}"/>'
            ),
            "send → recv",
        ),
    ]
    drawn_kinds = ("arrival", "last", "last", "mismatch", "never", "pairs")  # each item's kind, in order
    items = [item for item, kind in zip(items, drawn_kinds, strict=True) if has[kind]]
    ops = dict.fromkeys(c.op for seg in drawn for c in seg)
    codes = " &middot; ".join(f"<b>{_e(_op_code(op))}</b> {_e(op)}" for op in ops)
    spans = "".join(f'<span style="white-space:nowrap">{icon} {_e(words)}</span>' for icon, words in items)
    return (
        f'<div data-xray-legend style="display:flex;flex-wrap:wrap;gap:2px 14px;color:{TEXT2};font-size:12px">{spans}'
        + (f'<span style="white-space:nowrap">{codes}</span>' if codes else "")
        + "</div>"
    )


_WORD = re.compile(r"[A-Za-z0-9]+")


def _op_code(op: str) -> str:
    """The letters written on an op's marks: ``AR`` for all_reduce; an op this does not know, the first
    letter of each of its words (at most three)."""
    if op in OP_CODES:
        return OP_CODES[op]
    words = _WORD.findall(op)
    return "".join(w[0] for w in words[:3]).upper() or "?"


def _short_count(count: int) -> str:
    if count >= 1_000_000:
        return f"{count / 1e6:.1f}M"
    if count >= 10_000:
        return f"{count / 1e3:.0f}k"
    return f"{count:,}"


def _bytes_text(count: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} B"


def _e(text: str) -> str:
    return html.escape(text, quote=True)
