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
import re
from collections import deque

from ._run import RankState, Run
from ._view_text import settle_line

MIME = "application/vnd.nbspawn.run+json"
TAIL_LINES = 2000  # per rank, in the kernel and in the browser
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


class OutputTail:
    """The newest ``limit`` lines of one rank's output, as (stream, text) chunks in arrival order."""

    def __init__(self, limit: int = TAIL_LINES) -> None:
        self.limit = limit
        self.chunks: deque[list[str]] = deque()
        self.lines = 0
        self.elided_lines = 0

    def add(self, stream: str, text: str) -> None:
        if self.chunks and self.chunks[-1][0] == stream:
            self.chunks[-1][1] += text
        else:
            self.chunks.append([stream, text])
        self.lines += text.count("\n")
        while self.lines > self.limit and self.chunks:
            self._drop_oldest_line()

    def _drop_oldest_line(self) -> None:
        stream, text = self.chunks[0]
        cut = text.find("\n")
        if cut < 0 or cut == len(text) - 1:
            self.chunks.popleft()
            dropped = text.count("\n")
        else:
            self.chunks[0][1] = text[cut + 1 :]
            dropped = 1
        self.lines -= dropped
        self.elided_lines += dropped


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
        "output": [list(c) for c in tail.chunks] if tail else [],
        "elided_lines": tail.elided_lines if tail else 0,
        "stdout_path": state.stdout_path,
        "stderr_path": state.stderr_path,
    }


def run_record(run: Run, tails: dict[int, OutputTail]) -> dict:
    error = run.error
    root = getattr(error, "root", None)
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
            "summary": str(error).splitlines()[0] if str(error) else type(error).__name__,
            "traceback": _ANSI.sub("", str(error)),
        },
        "ranks": [rank_record(state, tails.get(state.rank)) for state in run.ranks],
    }


def plain_lines(chunks: list[list[str]], rank: int) -> list[str]:
    text = "".join(text for _stream, text in chunks)
    return [f"[rank{rank}]: {settle_line(_ANSI.sub('', line))}" for line in text.splitlines()]


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
        for stream, text in rank["output"]:
            lines = "\n".join(settle_line(_ANSI.sub("", ln)) for ln in text.split("\n"))
            style = ' style="background:#fff0f0"' if stream == "stderr" else ""
            body.append(f"<span{style}>{e(lines)}</span>")
        parts.append('<pre style="margin:2px 0 6px 0;max-height:24em;overflow:auto">' + "".join(body) + "</pre></details>")
    parts.append("</div>")
    return "".join(parts)


class FrozenRun:
    """What replaces the live view when the run ends; IPython displays it through its mime bundle."""

    def __init__(self, run: Run, tails: dict[int, OutputTail]) -> None:
        self.record = run_record(run, tails)

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:  # noqa: ANN001
        return {MIME: self.record, "text/html": to_html(self.record), "text/plain": to_text(self.record)}
