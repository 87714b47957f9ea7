"""A widget tree (``nbspawn.events._display.widget_tree``: boxes, progress bars, text) as one line of
text, the way tqdm draws its own text bar: ``Epoch 1:  45%|████▌     | 45/100 [00:01<00:02]``.

The one drawing of a widget as text: a display item's ``text`` (what a saved run's text/plain and a
view without rich output show) and the text view's live bars both come from here.
"""

from __future__ import annotations

from typing import Any

_BAR_WIDTH = 10
_BLOCKS = "▏▎▍▌▋▊▉"


def _bar(node: dict[str, Any], width: int = _BAR_WIDTH) -> tuple[float, str]:
    """A progress node's fraction and its bar, drawn with eighth blocks as tqdm draws it."""
    bounds: tuple[Any, Any, Any] = (node.get("min"), node.get("max"), node.get("value"))
    low, high, value = bounds
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (low, high, value))
    frac = 0.0 if not numbers or high <= low else min(1.0, max(0.0, (value - low) / (high - low)))
    eighths = int(frac * width * 8)
    bar = "█" * (eighths // 8) + (_BLOCKS[eighths % 8 - 1] if eighths % 8 else "")
    return frac, bar.ljust(width)


def widget_text(tree: Any) -> str:
    """A widget tree as text: ``Epoch 1:  45%|████▌     | 45/100 [00:01<00:02]``.

    A ``tqdm.notebook`` bar (a row of text, progress, text) reads exactly as tqdm's own text bar; a
    progress bar with no text beside it gets its description and percentage.  A column is one line
    per child.
    """
    if not isinstance(tree, dict):
        return ""
    kind = tree.get("type")
    if kind == "text":  # tqdm.notebook keeps its columns with figure spaces; text has real ones
        return str(tree.get("value", "")).replace("\u2007", " ")
    if kind == "other":
        return str(tree.get("text", ""))
    if kind == "progress":
        frac, bar = _bar(tree)
        description = str(tree.get("description") or "")
        return f"{description + ': ' if description else ''}{frac * 100:3.0f}%|{bar}|"
    children = [c for c in tree.get("children") or [] if isinstance(c, dict)]
    if tree.get("dir") == "column":
        return "\n".join(t for t in (widget_text(c) for c in children) if t)
    texts = any(c.get("type") == "text" and c.get("value") for c in children)
    parts: list[str] = []
    for child in children:
        if child.get("type") == "progress" and texts:  # tqdm's {l_bar}{bar}{r_bar}: the text says the rest
            description = str(child.get("description") or "")
            parts.append(f"{description + ' ' if description else ''}|{_bar(child)[1]}|")
        else:
            parts.append(widget_text(child))
    return "".join(parts)
