"""What ranks display, turned into items every view can draw (docs/run-bundle.md, section 2).

A rank records raw ``display()`` calls and its widgets' state in ``display.jsonl``; the run turns
each record into a display item, once, for all its views:

* one representation is chosen per output (the richest a static page can draw without a kernel),
  so nothing is sent or saved twice;
* widgets a rank built (a ``tqdm.notebook`` bar: an HBox of two HTML widgets around an IntProgress)
  are reduced to a small tree of boxes, progress bars and text, re-sent whenever one of them changes;
* images count against the run's image budget; past it an image becomes a line that says what was
  dropped and where the full data is (the rank's ``display.jsonl``, which keeps everything).
"""

from __future__ import annotations

import html
import re
from typing import Any

from ._widgetbar import widget_text

WIDGET_MIME = "application/vnd.nbspawn.widget+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
PREFERENCE = (
    WIDGET_MIME,
    "text/html",
    "image/png",
    "image/jpeg",
    "image/gif",
    "image/svg+xml",
    "text/markdown",
    "text/latex",
    "text/plain",
)
IMAGES = ("image/png", "image/jpeg", "image/gif", "image/svg+xml")
_BOXES = {"HBoxModel": "row", "BoxModel": "row", "GridBoxModel": "row", "VBoxModel": "column"}
_PROGRESS = ("IntProgressModel", "FloatProgressModel")
_TEXTS = ("HTMLModel", "HTMLMathModel", "LabelModel", "TextModel", "TextareaModel")
_TAG = re.compile(r"<[^>]*>")


class DisplayItems:
    """Turns one run's display records into items; keeps each rank's widgets and the image budget."""

    def __init__(self, image_budget: int, display_paths: dict[int, str]) -> None:
        self.image_budget = image_budget
        self.image_bytes = 0
        self.paths = display_paths
        self.records: dict[int, int] = {}  # rank -> records read (the line number in display.jsonl)
        self.widgets: dict[int, dict[str, dict[str, Any]]] = {}  # rank -> model id -> state
        self.shown_widgets: dict[int, set[str]] = {}  # rank -> model ids displayed
        self.image_sizes: dict[tuple[int, str], int] = {}  # (rank, display id) -> bytes held
        self.dropped_images = 0

    def convert(self, rank: int, record: dict[str, Any]) -> list[dict[str, Any]]:
        line = self.records[rank] = self.records.get(rank, 0) + 1
        if record.get("clear"):
            return [{"kind": "clear", "wait": bool(record.get("wait"))}]
        if "widget" in record:
            return self._widget(rank, record)
        data = record.get("data")
        if not isinstance(data, dict):
            return []
        kind = "update" if record.get("update") else "data"
        transient = record.get("transient") or {}
        display_id = transient.get("display_id") if isinstance(transient, dict) else None
        view = data.get(WIDGET_VIEW)
        if isinstance(view, dict) and isinstance(view.get("model_id"), str):
            model = view["model_id"]
            self.shown_widgets.setdefault(rank, set()).add(model)
            return [self._widget_item(rank, model, kind)]
        mime = next((m for m in PREFERENCE if m in data and m != WIDGET_MIME), None)
        if mime is None:
            return []
        value = data[mime]
        if isinstance(value, list):  # nbformat's multiline strings
            value = "".join(str(v) for v in value)
        if not isinstance(value, str):
            value = str(value)
        text = data.get("text/plain", "")
        text = "".join(text) if isinstance(text, list) else str(text)
        metadata = record.get("metadata") or {}
        meta = metadata.get(mime, {}) if isinstance(metadata, dict) else {}
        item: dict[str, Any] = {"kind": kind, "id": display_id, "mime": mime, "value": value, "text": text}
        if isinstance(meta, dict) and meta:
            item["meta"] = {k: v for k, v in meta.items() if k in ("width", "height", "unconfined")}
        if mime in IMAGES and not self._afford(rank, display_id, len(value)):
            item.update(mime="text/plain", value=self._dropped(rank, mime, len(value), line), meta={})
        return [item]

    # -- images -------------------------------------------------------------------------------------

    def _afford(self, rank: int, display_id: str | None, size: int) -> bool:
        """Whether an image fits the run's budget; an updated display gives back its old image's room."""
        key = (rank, display_id) if display_id else None
        held = self.image_sizes.get(key, 0) if key else 0
        if self.image_bytes - held + size > self.image_budget:
            self.dropped_images += 1
            return False
        self.image_bytes += size - held
        if key:
            self.image_sizes[key] = size
        return True

    def _dropped(self, rank: int, mime: str, size: int, line: int) -> str:
        return (
            f"[{mime}, {size // 1024} KB, not shown: this run's images are capped at "
            f"{self.image_budget // 1024} KB (SpawnMagics.max_image_kb); the full data is in "
            f"{self.paths.get(rank, 'display.jsonl')}, line {line}]"
        )

    # -- widgets ------------------------------------------------------------------------------------

    def _widget(self, rank: int, record: dict[str, Any]) -> list[dict[str, Any]]:
        states = self.widgets.setdefault(rank, {})
        model = str(record["widget"])
        if record.get("closed"):
            states.setdefault(model, {})["__closed__"] = True
        else:
            state = record.get("state")
            if isinstance(state, dict):
                states.setdefault(model, {}).update(state)
        shown = self.shown_widgets.get(rank, set())
        return [self._widget_item(rank, root, "update") for root in sorted(shown) if self._contains(states, root, model)]

    def _widget_item(self, rank: int, model: str, kind: str) -> dict[str, Any]:
        states = self.widgets.get(rank, {})
        tree = widget_tree(states, model)
        return {"kind": kind, "id": f"widget:{model}", "mime": WIDGET_MIME, "value": tree, "text": widget_text(tree)}

    def _contains(self, states: dict[str, dict[str, Any]], root: str, model: str, depth: int = 0) -> bool:
        if root == model:
            return True
        state = states.get(root, {})
        refs = [*_refs(state.get("children")), *_refs([state.get("layout")])]
        return depth < 20 and any(self._contains(states, child, model, depth + 1) for child in refs)


def _refs(values: Any) -> list[str]:
    if not isinstance(values, list):
        return []
    return [v[len("IPY_MODEL_") :] for v in values if isinstance(v, str) and v.startswith("IPY_MODEL_")]


def _hidden(states: dict[str, dict[str, Any]], state: dict[str, Any]) -> bool:
    if state.get("__closed__"):
        return True
    layout = _refs([state.get("layout")])
    look = states.get(layout[0], {}) if layout else {}
    return look.get("display") == "none" or look.get("visibility") == "hidden"


def _plain(value: Any) -> str:
    return html.unescape(_TAG.sub("", value)) if isinstance(value, str) else ""


def widget_tree(states: dict[str, dict[str, Any]], model: str, depth: int = 0) -> dict[str, Any]:
    """A widget and its children as docs/run-bundle.md's tree: boxes, progress bars, text, other."""
    state = states.get(model)
    if state is None or depth > 20:
        return {"type": "other", "text": ""}
    if _hidden(states, state):
        return {"type": "box", "dir": "row", "children": []}
    name = str(state.get("_model_name", ""))
    description = _plain(state.get("description", ""))
    if name in _BOXES:
        children = [widget_tree(states, child, depth + 1) for child in _refs(state.get("children"))]
        return {"type": "box", "dir": _BOXES[name], "children": children}
    if name in _PROGRESS:
        return {
            "type": "progress",
            "value": _number(state.get("value"), 0),
            "min": _number(state.get("min"), 0),
            "max": _number(state.get("max"), 100),
            "bar_style": str(state.get("bar_style") or ""),
            "description": description,
        }
    if name in _TEXTS:
        text = _plain(state.get("value", ""))
        return {"type": "text", "value": f"{description} {text}".strip() if description else text}
    label = name[:-5] if name.endswith("Model") else name
    return {"type": "other", "text": f"{label}({description!r})" if description else f"{label}()"}


def _number(value: Any, default: float) -> float:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else default
