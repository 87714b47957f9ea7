"""``%spawn show WORLD NAME``, drawn: what a name holds on each rank of a kept world (issue #43, item 4).

For a DTensor, rank by rank, a picture of the global tensor (its first two dimensions; a vector as one
row) with the part this rank holds filled in the rank's colour, and in words its local shape and where
it starts (``rank 1: [2, 4] at [2:4, 0:4]``); a replicated tensor shows every rank holding the whole.
pytorch's ``visualize_sharding`` prints a table on rank 0 only; this lines every rank up, and is
static HTML and inline SVG (inline styles, no script), so a saved notebook shows it anywhere.
For anything else, a row per rank: type, shape, dtype, device, bytes (a module: its parameters, what
this rank holds of them, devices, and its first DTensor parameters' placements).
"""

from __future__ import annotations

import html
import re
from typing import Any

from ..events._resources import gigabytes

TEXT = "var(--jp-ui-font-color1,#1f2328)"
TEXT2 = "var(--jp-ui-font-color2,#57606a)"
LINE = "var(--jp-ui-font-color3,#8c959f)"
RANK_HUES = (212, 140, 275, 32, 186, 318, 80, 245, 160, 292)  # labextension/src/lines.ts's, for the same colours
PICTURE = 132  # the global tensor's longer side, in pixels


def rank_hue(rank: int) -> int:
    if rank < len(RANK_HUES):
        return RANK_HUES[rank]
    hue = round((rank * 137.508 + 200) % 360)
    return (hue + 30) % 360 if hue < 15 or hue > 345 else hue


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _shape(shape: list[int] | None) -> str:
    return "[" + ", ".join(str(d) for d in shape or []) + "]"


def _bytes(value: int | None) -> str:
    if value is None:
        return ""
    return gigabytes(value) if value >= 10**6 else f"{value / 1000:.1f} KB" if value >= 1000 else f"{value} B"


def _dotted(text: str) -> str:
    """``text`` escaped, a line allowed to break after each dot of a dotted path (``torch.distributed.fsdp.<wbr>...``)."""
    return re.sub(r"\.(?=[A-Za-z_])", ".<wbr>", _e(text))


def span_text(shape: list[int], offset: list[int]) -> str:
    """``[2:4, 0:4]``: where a local shard lies in the global tensor."""
    return "[" + ", ".join(f"{o}:{o + s}" for o, s in zip(offset, shape, strict=False)) + "]"


def describe_line(answer: dict[str, Any]) -> str:
    """One rank's answer in words."""
    rank = answer["rank"]
    if "missing" in answer:
        return f"rank {rank}: {answer['missing']}"
    head = f"rank {rank}: {answer['type']}"
    if answer.get("dtensor"):
        where = (
            f" at {span_text(answer['local_shape'], answer['offset'])}"
            if "offset" in answer and answer["local_shape"] and all(answer["local_shape"])
            else ""
        )
        mesh = _shape(answer["mesh_shape"]) + (f" ({', '.join(answer['mesh_dims'])})" if answer["mesh_dims"] else "")
        return (
            f"{head} {_shape(answer['shape'])} {answer['dtype']} on mesh {mesh} [{', '.join(answer['placements'])}]: "
            f"holds {_shape(answer['local_shape'])}{where} on {answer['device']} ({_bytes(answer['bytes'])})"
        )
    if "shape" in answer:
        return f"{head} {_shape(answer['shape'])} {answer['dtype']} on {answer['device']} ({_bytes(answer['bytes'])})"
    if "parameters" in answer:
        sharded = [p for p in answer.get("params", []) if p.get("dtensor")]
        line = (
            f"{head}: {answer['parameters']:,} parameters in {answer['tensors']} tensors, this rank holds "
            f"{_bytes(answer['bytes'])} on {', '.join(answer['devices']) or 'no device'}"
        )
        if sharded:
            line += (
                f"; {sharded[0]['name']} is [{', '.join(sharded[0]['placements'])}] on mesh {_shape(sharded[0]['mesh_shape'])}"
            )
        return line
    return f"{head}: {answer.get('repr', '')}"


def shown_text(world: str, expression: str, answers: list[dict[str, Any]]) -> str:
    return "\n".join([f"{expression} on world {world!r}, rank by rank:", *(describe_line(a) for a in answers)])


def _picture(answer: dict[str, Any]) -> str:
    """The global tensor's first two dimensions, this rank's shard filled."""
    shape = answer["shape"] or [1]
    rows, cols = (shape[0], shape[1]) if len(shape) >= 2 else (1, shape[0])
    rows, cols = max(1, rows), max(1, cols)
    scale = PICTURE / max(rows, cols)
    width, height = max(8.0, cols * scale), max(8.0, rows * scale)
    hue = rank_hue(answer["rank"])
    parts = [
        f'<svg width="{width:.0f}" height="{height:.0f}" viewBox="0 0 {width:.1f} {height:.1f}" '
        f'role="img" aria-label="rank {answer["rank"]}\'s shard" style="display:block">',
        f'<rect x="0.5" y="0.5" width="{width - 1:.1f}" height="{height - 1:.1f}" fill="none" stroke="{LINE}" stroke-dasharray="3 2"/>',
    ]
    local, offset = answer.get("local_shape") or [], answer.get("offset")
    if offset is not None and local and all(local):
        if len(shape) >= 2:
            y, x, h, w = offset[0], offset[1], local[0], local[1]
        else:
            y, x, h, w = 0, offset[0], 1, local[0]
        parts.append(
            f'<rect data-shard x="{x * scale:.1f}" y="{y * scale:.1f}" width="{max(1.0, w * scale):.1f}" '
            f'height="{max(1.0, h * scale):.1f}" fill="hsl({hue},60%,55%)" fill-opacity="0.85" stroke="hsl({hue},60%,35%)"/>'
        )
    parts.append("</svg>")
    return "".join(parts)


def shown_html(world: str, expression: str, answers: list[dict[str, Any]]) -> str:
    """The static drawing: a card per rank (a picture for a DTensor), then each rank in words."""
    cards = []
    for answer in answers:
        hue = rank_hue(answer["rank"])
        picture = _picture(answer) if answer.get("dtensor") else ""
        words = describe_line(answer).split(": ", 1)[-1]
        if answer.get("dtensor") and ": holds " in words:  # what every rank shares is said once, above the cards
            words = "holds " + words.split(": holds ", 1)[1]
        cards.append(
            f'<div data-rank="{answer["rank"]}" style="border:1px solid {LINE};border-top:3px solid hsl({hue},60%,50%);'
            f'border-radius:4px;padding:6px;min-width:9em;max-width:{PICTURE + 120}px">'
            f'<div style="font-weight:600">rank {answer["rank"]}</div>{picture}'
            # a module's type is one long word (FSDPSequential, a dotted path): broken anywhere, it stays in its card
            f'<div style="color:{TEXT2};font-size:12px;margin-top:4px;overflow-wrap:anywhere">{_dotted(words)}</div></div>'
        )
    dimensions = ""
    first = next((a for a in answers if a.get("dtensor")), None)
    if first is not None:
        common = describe_line(first).split(": ", 1)[-1].split(": holds ", 1)[0]
        dimensions = f": <span data-shards-common>{_e(common)}</span>"
        if len(first["shape"]) > 2:
            dimensions += f' <span style="color:{TEXT2}">(its first two dimensions drawn)</span>'
    return (
        f'<div class="nbspawn-shards" data-world="{_e(world)}" style="font-family:var(--jp-ui-font-family,sans-serif);'
        f'font-size:13px;color:{TEXT}"><div><b>{_e(expression)}</b> on world <code>{_e(world)}</code>, rank by rank'
        f"{dimensions}</div>"
        f'<div style="display:flex;flex-wrap:wrap;gap:8px;margin-top:6px">{"".join(cards)}</div></div>'
    )


def shown_bundle(world: str, expression: str, answers: list[dict[str, Any]]) -> dict[str, object]:
    return {"text/html": shown_html(world, expression, answers), "text/plain": shown_text(world, expression, answers)}
