"""``--xray values`` drawn: a table of each collective's values, every rank's before and after (issue #43).

Pure: it takes the rows ``events._xray_values.line_up`` made (``run.xray.values``) and returns static
HTML, to go under the X-ray's drawing (``views._xray_html``) in the live widget and the saved
snapshot.  As that drawing: no script, no stylesheet (inline styles only: nbconvert and GitHub drop
stylesheets), every byte a rank or torch named escaped, JupyterLab's colours with a light fallback.

One row per collective: ``all_reduce #1 sum | [1] | [2] | [3] | [4] | → | [10] | [10] | [10] | [10]``.
Numbers are short (``10.0`` is ``10``; four significant digits), a long list shows its first and last
numbers around an ellipsis, a tensor recorded by its shape only reads ``⟨1024×1024 float32⟩``.

Bounded: at most :data:`MAX_BYTES` of HTML whatever the run (a cell is cut at :data:`MAX_CELL`
characters, rows stop once the budget is spent, and the table says how many it leaves out).
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from typing import Any

from ..events._xray_values import ValueRow

MAX_BYTES = 20_000  # the table's HTML, at the most
MAX_CELL = 96  # characters of one rank's side of one collective
SHOWN_ITEMS = 6  # a list longer than this many plus two: its first SHOWN_ITEMS, an ellipsis, its last
MAX_RANKS = 16  # ranks drawn under each collective; a bigger world's others are said, not drawn

TEXT = "var(--jp-ui-font-color1,#1f2328)"
TEXT2 = "var(--jp-ui-font-color2,#57606a)"
BORDER = "var(--jp-border-color2,#d0d7de)"
HEAD_BG = "var(--jp-layout-color2,#eef1f4)"
ERROR = "var(--jp-error-color1,#d32f2f)"
CELL = f"padding:1px 6px;border-bottom:1px solid {BORDER};white-space:nowrap"


def number(value: Any) -> str:
    """A number, short: ``10.0`` -> ``10``, four significant digits, ``nan``, ``inf``; a bool as
    ``True``; anything else its text."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return str(value) if abs(value) < 10**7 else f"{value:.4g}"
    if math.isnan(value) or math.isinf(value):
        return str(value)
    if value == int(value) and abs(value) < 10**7:
        return str(int(value))
    return f"{value:.4g}"


def values_text(values: Any) -> str:
    """A tensor's values as nested lists, each list cut to its first :data:`SHOWN_ITEMS` and its last
    around an ellipsis."""
    if not isinstance(values, list):
        return number(values)
    items = values if len(values) <= SHOWN_ITEMS + 2 else [*values[:SHOWN_ITEMS], ..., values[-1]]
    return "[" + ", ".join("…" if item is ... else values_text(item) for item in items) + "]"


def tensor_text(tensor: Any) -> str:
    """A recorded tensor: its values, or ``⟨shape dtype⟩`` where only its shape was kept."""
    if not isinstance(tensor, dict):
        return ""
    if "values" in tensor:
        return values_text(tensor["values"])
    shape = "×".join(str(d) for d in tensor.get("shape") or []) or "scalar"
    return f"⟨{shape} {tensor.get('dtype', '')}⟩".replace(" ⟩", "⟩")


def side_text(side: Any) -> str:
    """One rank's input or output: a tensor, or a list of them (``[1], [2]``); cut to :data:`MAX_CELL`."""
    if isinstance(side, list):
        text = ", ".join(tensor_text(tensor) for tensor in side) or "—"
    else:
        text = tensor_text(side)
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def _ranks(rows: Iterable[ValueRow]) -> list[int]:
    return sorted({rank for row in rows for rank in (*row.inputs, *row.outputs)})


def _td(text: str, style: str = "") -> str:
    return f'<td style="{CELL}{style}">{html.escape(text)}</td>'


def _row(row: ValueRow, ranks: Sequence[int]) -> str:
    """One collective: its name on a line of its own, then a line per rank, ``rank 2  [3]  →  [10]``
    (read down, as a learner compares the ranks; a wide world does not run off the side)."""
    label = f"{row.op} #{row.seq}"
    detail = " ".join(part for part in (row.detail, f"group {row.group}" if row.group not in ("", "0") else "") if part)
    title = "; ".join(row.notes)
    head = (
        f'<tr><td colspan="4" style="{CELL};padding-top:6px;font-family:var(--jp-ui-font-family,sans-serif)"'
        + (f' title="{html.escape(title)}"' if title else "")
        + f"><b>{html.escape(label)}</b>"
        + (f' <span style="color:{TEXT2}">{html.escape(detail)}</span>' if detail else "")
        + (f' <span style="color:{ERROR}">! {html.escape(title)}</span>' if title else "")
        + "</td></tr>"
    )
    lines = [
        "<tr>"
        + _td(f"rank {rank}", f";color:{TEXT2};padding-left:14px")
        + _td(side_text(row.inputs[rank]) if rank in row.inputs else "")
        + _td("→", f";color:{TEXT2}")
        + _td(side_text(row.outputs[rank]) if rank in row.outputs else "")
        + "</tr>"
        for rank in ranks
        if rank in row.inputs or rank in row.outputs
    ]
    return head + "".join(lines)


def values_html(rows: Sequence[ValueRow], beyond: int = 0, max_bytes: int = MAX_BYTES) -> str:
    """The table, ``""`` when there is nothing to show; at most ``max_bytes`` of HTML.  ``beyond``: the
    calls a rank made past those it recorded (``XRay.values_beyond``), said under the table."""
    if not rows:
        return ""
    every_rank = _ranks(rows)
    ranks = every_rank[:MAX_RANKS]
    top = (
        f'<tr style="background:{HEAD_BG}"><th style="{CELL};text-align:left">collective, rank</th>'
        f'<th style="{CELL};text-align:left">before (its input)</th><th style="{CELL}"></th>'
        f'<th style="{CELL};text-align:left">after (its output)</th></tr>'
    )
    opening = (
        f'<div class="nbspawn-xray-values" style="font-family:var(--jp-code-font-family,monospace);font-size:12px;'
        f'color:{TEXT};overflow-x:auto;margin-top:6px">'
        f'<table style="border-collapse:collapse;text-align:left">{top}'
    )
    closing = "</table>"
    said: list[str] = []
    if len(every_rank) > len(ranks):
        said.append(f"ranks {ranks[-1] + 1} and up are not shown ({len(every_rank)} ranks)")
    if beyond:
        said.append(f"the first calls of each rank only: {beyond} more were not recorded")
    budget = max_bytes - len(opening) - len(closing) - 400  # the words under the table
    drawn: list[str] = []
    used = 0
    for row in rows:
        text = _row(row, ranks)
        if used + len(text.encode()) > budget:
            break
        drawn.append(text)
        used += len(text.encode())
    if len(drawn) < len(rows):
        said.insert(0, f"{len(rows) - len(drawn)} more collectives not shown")
    words = "".join(f'<div style="color:{TEXT2};margin-top:2px">{html.escape(line)}</div>' for line in said)
    return f"{opening}{''.join(drawn)}{closing}{words}</div>"
