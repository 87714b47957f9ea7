"""A finished run as a static display bundle, readable with no kernel and no widget state.

The live view is replaced by this bundle when the run ends (``update_display``), so a saved notebook
shows the run on GitHub, nbviewer, nbconvert and VS Code, not "model not found"
(docs/run-bundle.md, section 4):

* ``application/vnd.nbspawn.run+json``: the run's facts (ranks, statuses, tracebacks, log paths);
* ``text/html``: a collapsible section per rank with its output tail, stored **once**, here: every
  byte of worker text escaped, colours as inline styles, displays as their static form, a rank's own
  HTML made inert (``_safehtml``: nothing in a saved notebook can act when it is reopened);
  the JupyterLab renderer reads the tails back from it, and merges them in the order they were
  printed by the outer ``<div data-order>`` (``_tail.order_runs``: whose entry comes next);
* ``text/plain``: a short summary.

A saved run is at most ``RunSpec.asked.max_saved_kb`` (256 KB by default), images aside: each rank's
tail is cut to its share, newest entries kept, the rest counted as elided; the logs are complete.
"""

from __future__ import annotations

import base64
import functools
import html
import json
import re
from typing import Any

from .._runstate import Run
from ..errors import rank_spans
from ..events._display import WIDGET_MIME
from ..events._resources import gigabytes
from ._messages import RankRecord, RunErrorRecord, RunRecord
from ._record import VERSION, run_record
from ._safehtml import safe_html
from ._sgr import ESCAPE, SGR, Style, apply_sgr, sgr_params, sgr_sequence, style_after, style_css
from ._tail import TAIL_LINES, Display, Entry, Line, OutputTail, merged_order, order_runs
from ._text import erase_backspaces
from ._xray_html import xray_html

MIME = "application/vnd.nbspawn.run+json"
NEWLINE = "&#10;"
__all__ = ["MIME", "TAIL_LINES", "FrozenRun", "OutputTail", "json_size", "tail_within"]


def json_size(text: str) -> int:
    """Bytes ``text`` takes in a Jupyter message (jupyter_client: JSON, ensure_ascii=False, UTF-8)."""
    return len(json.dumps(text, ensure_ascii=False).encode("utf-8", "surrogatepass"))


def tail_within(text: str, max_bytes: int, whole_lines: bool) -> str:
    """The longest end of ``text`` that fits in ``max_bytes`` of JSON; with ``whole_lines`` it starts
    at a line's start (or is empty)."""
    if max_bytes <= 2:
        return ""
    # a first guess by the text's own bytes-per-character, then shrink until it fits
    ratio = max(1.0, json_size(text) / max(1, len(text)))
    keep = min(len(text), int(max_bytes / ratio))
    part = text[len(text) - keep :]
    while part and json_size(part) > max_bytes:
        part = part[max(1, len(part) // 10) :]
    if whole_lines and part and part is not text and len(part) < len(text) and text[len(text) - len(part) - 1] != "\n":
        cut = part.find("\n")
        part = part[cut + 1 :] if cut >= 0 else ""
    return part


# -- the record ---------------------------------------------------------------------------------------


# -- text/html ----------------------------------------------------------------------------------------

_STATUS_COLOURS = {"done": "#1a7f37", "failed": "#cf222e", "failed_after": "#57606a", "stopped": "#9a6700", "running": "#0969da"}
_STREAM_CODE = {"stdout": "o", "stderr": "e"}
# what a terminal does not print (a bell, a lone escape); \t, \n and \r are the text's own
_CONTROLS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def line_html(line: Line) -> str:
    """One line as ``<span data-s>``, colour runs as ``<span data-sgr>`` with inline styles: the style
    in force (``_sgr``), its parameters written once, which ``labextension/src/mime.ts`` reads back."""
    text = _settled_with_colours(line.text)
    parts: list[str] = []
    style: Style = {}
    last = 0
    for match in ESCAPE.finditer(text):
        if match.start() > last:
            parts.append(_run_html(text[last : match.start()], style))
        sgr = SGR.fullmatch(match.group(0))
        if sgr:
            style = apply_sgr(style, sgr.group(1))
        last = match.end()
    if last < len(text):
        parts.append(_run_html(text[last:], style))
    # a character reference, not a newline: nbformat saves a string with newlines as one JSON string
    # per line, which would add ~10 bytes a line to the saved notebook
    end = NEWLINE if line.complete else ""
    return f'<span data-s="{_STREAM_CODE.get(line.stream, "o")}">{"".join(parts)}{end}</span>'


def _settled_with_colours(text: str) -> str:
    """A line's final state with the colours in force: the part after the last rewrite, \\b applied."""
    if "\r" in text:
        parts = text.split("\r")
        shown = [k for k, part in enumerate(parts) if ESCAPE.sub("", part)]
        if not shown:
            return ""
        k = shown[-1]
        text = sgr_sequence(style_after("\r".join(parts[:k]))) + parts[k]
    return erase_backspaces(text)


def _run_html(text: str, style: Style) -> str:
    body = html.escape(_CONTROLS.sub("", text), quote=False)
    params = sgr_params(style)
    if not params:
        return body
    return f'<span data-sgr="{params}" style="{style_css(style)}">{body}</span>'


def _widget_html(tree: dict[str, Any]) -> str:
    kind = tree.get("type")
    if kind == "box":
        flex = "column" if tree.get("dir") == "column" else "row"
        inner = "".join(_widget_html(child) for child in tree.get("children", []))
        return f'<span style="display:inline-flex;flex-direction:{flex};gap:6px;align-items:center">{inner}</span>'
    if kind == "progress":
        description = html.escape(str(tree.get("description", "")))
        label = f"<span>{description}</span>" if description else ""
        value, low, high = tree.get("value", 0), tree.get("min", 0), tree.get("max", 100)
        return f'{label}<progress value="{value - low}" max="{max(high - low, 0)}" style="width:20em"></progress>'
    return f"<span>{html.escape(str(tree.get('value', tree.get('text', ''))))}</span>"


def display_html(item: dict[str, Any]) -> str:
    """A display item's static form, in a ``<div data-display>``."""
    mime = str(item.get("mime", "text/plain"))
    value = item.get("value", "")
    attr = f' data-display="{html.escape(mime, quote=True)}"'
    meta = item.get("meta") or {}
    size = "".join(f' {k}="{int(v)}"' for k, v in meta.items() if k in ("width", "height") and isinstance(v, (int, float)))
    if mime == WIDGET_MIME and isinstance(value, dict):
        data = html.escape(json.dumps(value, ensure_ascii=False), quote=True)
        return f'<div{attr} data-widget="{data}">{_widget_html(value)}</div>'
    if mime in ("image/png", "image/jpeg", "image/gif"):
        return f'<div{attr}><img src="data:{mime};base64,{html.escape(str(value), quote=True)}"{size} style="max-width:100%;height:auto"></div>'
    if mime == "image/svg+xml":
        encoded = base64.b64encode(str(value).encode("utf-8")).decode("ascii")
        return f'<div{attr}><img src="data:image/svg+xml;base64,{encoded}"{size} style="max-width:100%;height:auto"></div>'
    if mime == "text/html":
        return f"<div{attr}>{safe_html(str(value))}</div>"
    text = html.escape(str(value), quote=False).replace("\n", NEWLINE)
    return f'<div{attr}><pre style="margin:0;white-space:pre-wrap">{text}</pre></div>'


def entries_html(entries: list[Entry]) -> str:
    return "".join(line_html(e) if isinstance(e, Line) else display_html(e.item) for e in entries)


def to_html(record: RunRecord, outputs: dict[int, list[Entry]], xray: str = "") -> str:
    """Static HTML: inline styles only (nbconvert and GitHub drop stylesheets), no script; ``xray``
    is the collectives X-ray's drawing (``views._xray_html``), after the ranks."""
    e = html.escape
    took = f" in {record['duration']:.2f} s" if record["duration"] is not None else ""
    parts = [
        f'<div class="nbspawn-run" data-nbspawn="{VERSION}" data-order="{order_runs(merged_order(outputs))}" '
        'style="font-family:var(--jp-ui-font-family,sans-serif);font-size:13px">',
        f"<div><b>nbspawn</b> run <code>{e(record['run_id'])}</code> &middot; {_count(record['nprocs'], 'rank')} &middot; "
        + (
            f"program <code>{e(record['program'])}</code> &middot; "
            if record["program"]
            else f"{e(record['start_method'])} &middot; backend {e(record['backend'])} &middot; "
        )
        + (f"world <code>{e(record['world'] or '')}</code>, cell {record['world_cell']} &middot; " if record["world"] else "")
        + f"<b>{e(_status_label(record))}</b>"
        f"{took} &middot; logs <code>{e(record['log_dir'])}</code></div>",
    ]
    if record["error"]:
        parts.append(
            '<div role="alert" style="border-left:3px solid #cf222e;padding:2px 6px;margin:4px 0">'
            f"{e(_banner(record['error']))}</div>"
        )
    memory = memory_line(record)
    if memory:
        parts.append(f'<div style="color:#57606a">{e(memory)}</div>')  # no data-* of its own: its words are the text's
    for rank in record["ranks"]:
        colour = _STATUS_COLOURS.get(rank["status"], "#57606a")
        status = _rank_status(rank) + (f" ({rank['summary']})" if rank["summary"] else "")
        if rank["duration"] is not None:
            status += f", {rank['duration']:.2f} s"
        if rank["peak_rss"]:
            status += f", peak {gigabytes(rank['peak_rss'])}"
        if rank.get("peak_gpu_allocated") is not None:
            status += f", {rank['gpu']} peak {gigabytes(rank['peak_gpu_allocated'] or 0)} ({gigabytes(rank['peak_gpu_reserved'] or 0)} reserved)"
        if rank["status"] in ("failed", "stopped", "done") and rank["note"]:
            # stopped: where it was ("has not entered barrier #1 (Cell In[2], ...)"); failed: out of GPU memory, what each rank held there;
            # done: a rank that finished the cell without entering the collective the others waited in ("never entered all_reduce #1")
            status += f" — {rank['note']}"
        open_attr = " open" if rank["status"] == "failed" or record["nprocs"] <= 4 else ""
        parts.append(
            f'<details data-rank="{rank["rank"]}"{open_attr}><summary><b>rank {rank["rank"]}</b> '
            + (f'<span style="color:#57606a">{e(rank["node"] or "")}</span> ' if rank["node"] else "")
            + f'<span style="color:{colour}">{e(status)}</span></summary>'
        )
        if rank["traceback"]:
            parts.append(
                '<pre data-traceback style="background:#ffebe9;color:#82071e;padding:6px;white-space:pre-wrap;margin:2px 0">'
                f"{e(rank['traceback']).replace(chr(10), NEWLINE)}</pre>"
            )
        body = []
        if rank["elided_lines"]:
            body.append(
                f'<div data-elided="{rank["elided_lines"]}" style="color:#57606a">{_count(rank["elided_lines"], "line")} elided '
                f"— full log at {e(rank['stdout_path'] or '')}</div>"
            )
        body.append(entries_html(outputs.get(rank["rank"], [])))
        parts.append(
            f'<div class="nbspawn-output" data-rank="{rank["rank"]}" style="font-family:monospace;white-space:pre-wrap;'
            f'margin:2px 0 6px 0;max-height:24em;overflow:auto">{"".join(body)}</div></details>'
        )
    if xray:
        parts.append(
            f"<details data-xray open><summary><b>collectives</b></summary>{xray}</details>"  # xray: a div.nbspawn-xray
        )
    parts.append("</div>")
    return "".join(parts)


def memory_line(record: RunRecord) -> str:
    """What the run needed, in one line: "memory: rank 2 peaked at 1.1 GB (the ranks' peaks: 2.1 GB in
    all); this machine has 12.7 GB"; and the warning, if the ranks brought it near its end."""
    peaks = {rank["rank"]: rank["peak_rss"] for rank in record["ranks"] if rank["peak_rss"]}
    if not peaks:
        return ""
    top = max(peaks, key=lambda r: peaks[r])
    line = f"memory: rank {top} peaked at {gigabytes(peaks[top])}"
    if len(peaks) > 1:
        line += f" (the ranks' peaks: {gigabytes(sum(peaks.values()))} in all)"
    memory = record.get("memory")
    if memory:
        line += f"; this {'container' if memory['source'] == 'container' else 'machine'} has {gigabytes(memory['total'])}"
    gpus = record.get("gpus") or []
    if gpus:
        line += "; on the GPUs, the most the ranks' torch held together: " + "; ".join(
            f"{gpu['gpu']} {gigabytes(gpu['reserved'])}" + (f" of {gigabytes(gpu['total'])}" if gpu["total"] else "")
            for gpu in gpus
        )
    if record.get("memory_warning"):
        line += f"; {record['memory_warning']}"
    return line


def _rank_status(rank: RankRecord) -> str:
    """A rank's status in words: ``failed after rank 2`` for one that failed once rank 2 had."""
    return f"failed after rank {rank['after']}" if rank["status"] == "failed_after" else rank["status"]


def _banner(error: RunErrorRecord) -> str:
    """The one line a view heads a failed run with: a stopped hang's verdict, else the error's first line."""
    return f"Hang: {error['verdict']}" if error.get("verdict") else error["summary"]


def _status_label(record: RunRecord) -> str:
    return "stopped (Stop button)" if record["status"] == "stopped" else record["status"]


def to_text(record: RunRecord) -> str:
    """A short summary; the output itself is in the text/html and the logs."""
    took = f" in {record['duration']:.2f} s" if record["duration"] is not None else ""
    lines = [
        f"nbspawn run {record['run_id']}: {_status_label(record)}{took}, {_count(record['nprocs'], 'rank')} "
        f"({record['program'] or record['start_method']}); logs: {record['log_dir']}"
    ]
    if record["error"]:
        lines.append(record["error"]["summary"])
        if record["error"].get("verdict"):
            lines.append(_banner(record["error"]))
    if record.get("xray"):
        lines.append(f"collectives: {record['xray']}")
    memory = memory_line(record)
    if memory:
        lines.append(memory)
    counts: dict[str, list[int]] = {}
    for rank in record["ranks"]:
        counts.setdefault(_rank_status(rank), []).append(rank["rank"])
    lines.append(", ".join(f"{status}: {_ranges(ranks)}" for status, ranks in counts.items()))
    return "\n".join(lines)


def _count(count: int, thing: str) -> str:
    """``1 rank``, ``2 ranks``."""
    return f"{count} {thing}" if count == 1 else f"{count} {thing}s"


def _ranges(ranks: list[int]) -> str:
    return "ranks " + rank_spans(ranks) if len(ranks) > 1 else f"rank {ranks[0]}"


class FrozenRun:
    """What replaces the live view when the run ends; IPython displays it through its mime bundle.

    Within ``max_bytes`` (images aside): the record and the summary first, then each rank's newest
    entries in an equal share of what is left (a quiet rank's unused share goes to the others).
    """

    def __init__(self, run: Run, tails: dict[int, OutputTail], max_bytes: int | None = None) -> None:
        max_bytes = run.spec.asked.max_saved_kb * 1024 if max_bytes is None else max_bytes
        elided = {rank: tail.elided_lines for rank, tail in tails.items()}
        record = run_record(run, elided)
        xray = xray_html(run.xray) if run.xray is not None else ""
        fixed = _saved_size(record) + json_size(to_text(record)) + json_size(to_html(record, {}, xray)) + SAVED_ENVELOPE
        outputs, left_out = _share(tails, max(0, max_bytes - fixed))
        for rank in record["ranks"]:
            rank["elided_lines"] += left_out.get(rank["rank"], 0)
        self.record = record
        self.html = to_html(record, outputs, xray)
        self.text = to_text(record)

    def _repr_mimebundle_(self, include: object = None, exclude: object = None) -> dict[str, Any]:
        return {MIME: self.record, "text/html": self.html, "text/plain": self.text}


SAVED_ENVELOPE = 1024  # the output's own keys in the notebook, and the text/plain's line breaks


def _saved_size(record: RunRecord) -> int:
    """The record's bytes as nbformat writes it: indented one space a level, about six levels deep.

    That is ``json.dumps(record, indent=1)`` plus six spaces a line, counted without making that text:
    with ``indent`` json encodes in Python (95 µs for a 4-rank record here), without it in C (35 µs);
    the line breaks and indents are counted from the record's shape."""
    text = json.dumps(record, ensure_ascii=False, separators=(",", ": "))
    lines, spaces = _line_breaks(record, 0)
    return len(text.encode("utf-8", "surrogatepass")) + lines + spaces + 6 * lines


def _line_breaks(value: Any, depth: int) -> tuple[int, int]:
    """Line breaks and indenting spaces ``json.dumps(value, indent=1)`` puts in ``value`` at ``depth``:
    a non-empty container breaks before each item (indented one deeper) and before its closing bracket."""
    if isinstance(value, dict):
        items: Any = value.values()
    elif isinstance(value, (list, tuple)):
        items = value
    else:
        return 0, 0
    if not items:
        return 0, 0
    lines, spaces = len(items) + 1, len(items) * (depth + 1) + depth
    for item in items:
        if isinstance(item, (dict, list, tuple)):
            more_lines, more_spaces = _line_breaks(item, depth + 1)
            lines += more_lines
            spaces += more_spaces
    return lines, spaces


def _share(tails: dict[int, OutputTail], room: int) -> tuple[dict[int, list[Entry]], dict[int, int]]:
    """Each rank's newest entries in an equal share of ``room``, the quiet ranks first: a rank whose
    entries fit in its share takes what it needs, and what it leaves goes to the ranks after it.

    An entry is sized by drawing it as HTML and counting its JSON, so only entries that could be kept
    are sized: each rank's newest, counted to just past the share of the turn (shares only grow from
    turn to turn).  Sizing every entry of a 16-rank flood (32,000) was 0.18 s of the 0.6-0.9 s from
    Stop's click to the cell's end (issue #57)."""
    sizes: dict[int, int] = {}  # by id(entry); also its place in the merged order (``data-order``): its rank and a comma
    newest_first = {rank: list(reversed(tail.entries.values())) for rank, tail in tails.items()}
    counted = dict.fromkeys(tails, (0, 0))  # each rank's (bytes, entries) counted so far, newest first

    def size(rank: int, entry: Entry) -> int:
        if id(entry) not in sizes:
            sizes[id(entry)] = _size(entry) + len(str(rank)) + 1
        return sizes[id(entry)]

    def counted_past(rank: int, cap: int) -> int:
        """The rank's newest entries' bytes, counted to just past ``cap`` or to its oldest."""
        total, done = counted[rank]
        entries = newest_first[rank]
        while total <= cap and done < len(entries):
            total, done = total + size(rank, entries[done]), done + 1
        counted[rank] = (total, done)
        return total

    outputs: dict[int, list[Entry]] = {}
    left_out: dict[int, int] = {}
    remaining = list(tails)
    while remaining:
        share = room // len(remaining)
        totals = {rank: counted_past(rank, share) for rank in remaining}
        fitting = [rank for rank in remaining if totals[rank] <= share]
        rank = min(fitting, key=totals.__getitem__) if fitting else remaining[0]  # else each left fills its share
        remaining.remove(rank)
        kept, dropped = tails[rank].newest(share, functools.partial(size, rank))
        outputs[rank], left_out[rank] = kept, dropped
        room -= sum(sizes[id(e)] for e in kept)
    return outputs, left_out


def _size(entry: Entry) -> int:
    if isinstance(entry, Display) and str(entry.item.get("mime", "")).startswith("image/"):
        return 0
    return json_size(entries_html([entry])) - 2  # as it is saved: inside the notebook's JSON
