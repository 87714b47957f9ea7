"""A finished run as a static display bundle, readable with no kernel and no widget state.

The live view is replaced by this bundle when the run ends (``update_display``), so a saved notebook
shows the run on GitHub, nbviewer and nbconvert, not "model not found":

* ``application/vnd.nbspawn.run+json``: the whole run (docs/run-bundle.md), for the JupyterLab renderer;
* ``text/html``: a collapsible section per rank, every byte of worker output escaped, no script;
* ``text/plain``: ``[rank{r}]: `` lines.

Output kept for display is bounded per rank (:class:`OutputTail`); the logs on disk are complete.
"""

from __future__ import annotations

import html
import json
import re
from collections import deque

from ._run import RankState, Run
from ._view_text import settle_line

MIME = "application/vnd.nbspawn.run+json"
TAIL_LINES = 2000  # per rank, in the kernel and in the browser
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


class OutputTail:
    """The newest ``limit`` lines of one rank's output, as [stream, text] chunks in arrival order.

    A line still open (no newline yet) is continued in the chunk where it began, even if the other
    stream wrote in between (so lines keep the order they were started in, as the front end's
    ``TerminalText`` shows them), and the states a carriage return overwrote are dropped from it,
    so a progress bar redrawn for hours takes the room of one line.
    """

    def __init__(self, limit: int = TAIL_LINES) -> None:
        self.limit = limit
        self.chunks: deque[list[str]] = deque()
        self.lines = 0
        self.elided_lines = 0
        self._open: dict[str, list[str]] = {}  # stream -> the chunk holding its open line

    def add(self, stream: str, text: str) -> None:
        if not text:
            return
        rest = text
        held = self._open.get(stream)
        if held is not None:
            # the line this stream left open goes on (or starts over) where it began, as on a
            # terminal and in the front end's TerminalText, even if the other stream wrote since
            first, newline, rest = text.partition("\n")
            start = held[1].rfind("\n") + 1
            held[1] = held[1][:start] + settle_rewrites(held[1][start:] + first) + newline
            if newline:
                del self._open[stream]
        if rest:
            chunk = [stream, settle_rewrites(rest)]
            self.chunks.append(chunk)
            if not rest.endswith("\n"):
                self._open[stream] = chunk
        self.lines += text.count("\n")
        if self.lines > self.limit:
            self._trim(self.lines - self.limit)

    def _trim(self, excess: int) -> None:
        """Drop the oldest ``excess`` lines, a whole chunk at a time where possible."""
        dropped = 0
        while excess > 0 and self.chunks:
            chunk = self.chunks[0]
            n = chunk[1].count("\n")
            if n <= excess:
                gone = self.chunks.popleft()
                for stream, held in list(self._open.items()):
                    if held is gone:
                        del self._open[stream]
            else:
                cut = -1
                for _ in range(excess):
                    cut = chunk[1].find("\n", cut + 1)
                chunk[1] = chunk[1][cut + 1 :]
                n = excess
            excess -= n
            dropped += n
        self.lines -= dropped
        self.elided_lines += dropped

    def merged(self) -> list[list[str]]:
        """The chunks, neighbours of one stream joined: what a bundle stores."""
        out: list[list[str]] = []
        for stream, text in self.chunks:
            if out and out[-1][0] == stream:
                out[-1][1] += text
            else:
                out.append([stream, text])
        return out

    def newest(self, max_bytes: int) -> tuple[list[list[str]], int]:
        """The newest whole lines that fit in about ``max_bytes`` of JSON, and how many lines were left out."""
        kept: list[list[str]] = []
        room = max_bytes
        left_out = 0
        chunks = self.merged()
        for i in range(len(chunks) - 1, -1, -1):
            stream, text = chunks[i]
            size = json_size(text)
            if size <= room:
                kept.append([stream, text])
                room -= size
                continue
            part = tail_within(text, room, whole_lines=True)
            if part:
                kept.append([stream, part])
            left_out += text[: len(text) - len(part)].count("\n")
            left_out += sum(c[1].count("\n") for c in chunks[:i])
            break
        kept.reverse()
        return kept, left_out


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


_REWIND_SGR = re.compile(r"\x1b\[[0-9;:]*m")


def settle_rewrites(text: str) -> str:
    """``text`` without the line states a carriage return overwrote (a progress bar's old frames).

    After a ``\\r``, the next visible character starts the line over (as the renderers and
    :func:`settle_line` do), so everything of that line before the last such return is dead, except
    colour codes, which still set the colour of what follows.  What is shown does not change.
    """
    if "\r" not in text:
        return text
    return "\n".join(_settle_rewrites_line(line) if "\r" in line else line for line in text.split("\n"))


def _settle_rewrites_line(line: str) -> str:
    parts = line.split("\r")
    for k in range(len(parts) - 1, 0, -1):
        if _ANSI.sub("", parts[k]).strip("\b"):
            break
    else:
        return line
    colours = "".join(_REWIND_SGR.findall("\r".join(parts[:k])))
    return colours + "\r" + "\r".join(parts[k:])


def rank_record(state: RankState, tail: OutputTail | None) -> dict:
    failure = state.failure
    return {
        "rank": state.rank,
        "pid": state.pid,
        "status": state.status,
        "exit_code": state.exit_code,
        "signal": state.signal_name,
        "duration": state.duration,
        "summary": failure.summary if failure else None,
        "traceback": (failure.traceback or failure.stack) if failure else None,
        "output": tail.merged() if tail else [],
        "elided_lines": tail.elided_lines if tail else 0,
        "stdout_path": state.stdout_path,
        "stderr_path": state.stderr_path,
    }


def run_record(run: Run, tails: dict[int, OutputTail]) -> dict:
    error = run.error
    root = getattr(error, "root", None)
    report = "" if error is None else str(error)  # the whole report: build it once
    return {
        "version": 1,
        "run_id": run.run_id,
        "nprocs": run.nprocs,
        "start_method": run.spec.start_method,
        "backend": run.spec.backend,
        "log_dir": run.run_dir,
        "started_at": run.started_at,
        "duration": run.duration,
        "status": run.status,
        "error": None
        if error is None
        else {
            "rank": root.rank if root else None,
            "summary": report.splitlines()[0] if report else type(error).__name__,
            "traceback": _ANSI.sub("", report),
        },
        "ranks": [rank_record(state, tails.get(state.rank)) for state in run.ranks],
    }


def output_lines(chunks: list[list[str]]) -> list[tuple[str, str]]:
    """(stream, line) in the order lines were started, each in its final state: as a terminal with
    one line per stream shows them (as the front end's ``TerminalText`` does), colours removed."""
    lines: list[list[str]] = []  # [stream, raw text]
    current: dict[str, list[str]] = {}
    for stream, text in chunks:
        pieces = text.split("\n")
        for i, piece in enumerate(pieces):
            ends = i < len(pieces) - 1
            if piece or ends:
                line = current.get(stream)
                if line is None:
                    line = current[stream] = [stream, ""]
                    lines.append(line)
                line[1] += piece
            if ends:
                current.pop(stream, None)
    out = [(stream, settle_line(_ANSI.sub("", raw))) for stream, raw in lines]
    # an open line left empty (a bar erased, a lone "\r") is not a line
    still_open = [id(line) for line in current.values()]
    return [(stream, text) for (stream, text), line in zip(out, lines) if text or id(line) not in still_open]


def plain_lines(chunks: list[list[str]], rank: int) -> list[str]:
    """``[rank{r}]: `` lines, each in its final state (``\\r`` and ``\\b`` applied, colours removed)."""
    return [f"[rank{rank}]: {text}" for _stream, text in output_lines(chunks)]


def to_text(record: dict) -> str:
    lines = [f"nbspawn run {record['run_id']}: {record['status']}, {record['nprocs']} ranks ({record['start_method']})"]
    for rank in record["ranks"]:
        lines.extend(plain_lines(rank["output"], rank["rank"]))
    if record["error"]:
        lines.append(record["error"]["traceback"])
    return "\n".join(lines)


_STATUS_COLOURS = {"done": "#1a7f37", "failed": "#cf222e", "stopped": "#9a6700", "running": "#0969da"}


def to_html(record: dict) -> str:
    """Static HTML: inline styles only (nbconvert and GitHub strip classes' stylesheets), no script."""
    e = html.escape
    parts = [
        '<div class="nbspawn-run" style="font-family:var(--jp-ui-font-family,sans-serif);font-size:13px">',
        f"<div><b>nbspawn</b> run <code>{e(record['run_id'])}</code> &middot; {record['nprocs']} ranks &middot; "
        f"{e(record['start_method'])} &middot; backend {e(record['backend'])} &middot; <b>{e(record['status'])}</b>"
        + (f" in {record['duration']:.2f} s" if record["duration"] is not None else "")
        + f" &middot; logs <code>{e(record['log_dir'])}</code></div>",
    ]
    if record["error"]:
        parts.append(
            '<pre style="background:#ffebe9;color:#82071e;padding:6px;white-space:pre-wrap">'
            f"{e(record['error']['traceback'])}</pre>"
        )
    for rank in record["ranks"]:
        colour = _STATUS_COLOURS.get(rank["status"], "#57606a")
        status = rank["status"] + (f" ({rank['summary']})" if rank["summary"] else "")
        if rank["duration"] is not None:
            status += f", {rank['duration']:.2f} s"
        open_attr = " open" if rank["status"] == "failed" or record["nprocs"] <= 4 else ""
        parts.append(f'<details{open_attr}><summary><b>rank {rank["rank"]}</b> '
                     f'<span style="color:{colour}">{e(status)}</span></summary>')
        body = []
        if rank["elided_lines"]:
            body.append(f'<span style="color:#57606a">{rank["elided_lines"]} lines elided — full log at '
                        f'{e(rank["stdout_path"])}</span>\n')
        lines = output_lines(rank["output"])
        i = 0
        while i < len(lines):  # a span per run of lines of one stream
            stream, j = lines[i][0], i
            while j < len(lines) and lines[j][0] == stream:
                j += 1
            style = ' style="background:#fff0f0"' if stream == "stderr" else ""
            body.append(f"<span{style}>{e(''.join(text + chr(10) for _s, text in lines[i:j]))}</span>")
            i = j
        parts.append('<pre style="margin:2px 0 6px 0;max-height:24em;overflow:auto">' + "".join(body) + "</pre></details>")
    parts.append("</div>")
    return "".join(parts)


class FrozenRun:
    """What replaces the live view when the run ends; IPython displays it through its mime bundle."""

    def __init__(self, run: Run, tails: dict[int, OutputTail]) -> None:
        self.record = run_record(run, tails)

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:  # noqa: ANN001
        return {MIME: self.record, "text/html": to_html(self.record), "text/plain": to_text(self.record)}
