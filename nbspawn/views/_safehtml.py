"""A rank's HTML made inert for the saved snapshot: what can show stays, nothing that can act.

A rank's ``text/html`` (a DataFrame, rich's HTML, a table a cell built from data it fetched) is saved
inside the run's frozen bundle, which a trusted notebook renders as is when it is reopened.  So it
goes through nh3 (the binding of Rust's ammonia, an HTML5 parser with an allow-list) rather than a
hand-written filter: tags are balanced (it cannot swallow the bundle's layout), and of the markup only
the presentational part is kept:

* tags: ammonia's safe set (text, lists, tables, images, details) plus ``tfoot``, ``progress``,
  ``meter``, ``font``; ``script`` and ``style`` elements go with their content;
* attributes: presentation only (``style``, ``class``, table and image sizes, ``href``/``src``);
  never an event handler, never a ``data-*`` the renderer reads back (``data-s``, ``data-rank``);
* URLs: ``http``, ``https``, ``mailto`` and relative links; ``data:`` only as an image's source
  (``data:image/...``, as matplotlib and pandas embed them);
* inline styles: presentational properties only, and no CSS function but colours, ``var`` and
  ``calc`` (so no ``url(javascript:…)``, no ``expression()``, nothing fetched), no ``\\`` escapes;
* classes: none of the page's own (``jp-``, ``lm-``) or the bundle's (``nbspawn``, ``nbs-``).
"""

from __future__ import annotations

import re

import nh3

TAGS = frozenset(nh3.ALLOWED_TAGS | {"tfoot", "progress", "meter", "font"})
_TABLE = {"align", "valign", "colspan", "rowspan", "width", "height", "bgcolor", "border", "cellpadding", "cellspacing", "scope"}
ATTRIBUTES = {
    "*": {"style", "class", "title", "dir", "lang", "align"},
    "a": {"href"},
    "img": {"src", "alt", "width", "height"},
    "table": _TABLE | {"summary"},
    "td": _TABLE,
    "th": _TABLE,
    "tr": _TABLE,
    "col": {"span", "width"},
    "colgroup": {"span", "width"},
    "ol": {"start", "type"},
    "details": {"open"},
    "progress": {"value", "max"},
    "meter": {"value", "min", "max", "low", "high", "optimum"},
    "font": {"color", "size", "face"},
}
URL_SCHEMES = frozenset({"http", "https", "mailto", "data"})  # data: only for an image (_keep)
STYLE_PROPERTIES = frozenset(
    {
        "color", "background", "background-color", "opacity",
        "font", "font-family", "font-size", "font-style", "font-weight", "font-variant", "line-height",
        "text-align", "text-decoration", "text-decoration-line", "text-decoration-color", "text-decoration-style",
        "text-indent", "text-transform", "text-overflow", "letter-spacing", "word-spacing", "white-space",
        "word-break", "overflow-wrap", "word-wrap", "vertical-align", "direction",
        "border", "border-top", "border-right", "border-bottom", "border-left", "border-color", "border-style",
        "border-width", "border-radius", "border-collapse", "border-spacing",
        "border-top-color", "border-right-color", "border-bottom-color", "border-left-color",
        "border-top-style", "border-right-style", "border-bottom-style", "border-left-style",
        "border-top-width", "border-right-width", "border-bottom-width", "border-left-width",
        "margin", "margin-top", "margin-right", "margin-bottom", "margin-left",
        "padding", "padding-top", "padding-right", "padding-bottom", "padding-left",
        "width", "height", "min-width", "min-height", "max-width", "max-height",
        "display", "overflow", "overflow-x", "overflow-y", "table-layout", "caption-side", "empty-cells",
        "list-style", "list-style-type", "list-style-position", "box-sizing", "float", "clear",
        "flex", "flex-direction", "flex-wrap", "gap", "align-items", "justify-content",
    }
)  # fmt: skip
_CSS_FUNCTION = re.compile(r"([a-z-]*)\s*\(", re.IGNORECASE)
_SAFE_FUNCTIONS = frozenset({"rgb", "rgba", "hsl", "hsla", "var", "calc"})
_OWN_CLASS = re.compile(r"^(?:jp-|lm-|nbs-|nbspawn)", re.IGNORECASE)
_IMAGE_DATA = re.compile(r"^\s*data:image/[a-z0-9.+-]+[;,]", re.IGNORECASE)


def _inert_style(value: str) -> str | None:
    """The declarations of an inline style that use no CSS function but colours, ``var``, ``calc``."""
    kept = [
        declaration.strip()
        for declaration in value.split(";")
        if "\\" not in declaration
        and "/*" not in declaration
        and all(name.lower() in _SAFE_FUNCTIONS for name in _CSS_FUNCTION.findall(declaration))
    ]
    return "; ".join(d for d in kept if d) or None


def _keep(tag: str, attribute: str, value: str) -> str | None:
    """nh3's attribute filter: the value to keep, or None to drop the attribute."""
    if attribute == "style":
        return _inert_style(value)
    if attribute == "class":
        return " ".join(c for c in value.split() if not _OWN_CLASS.match(c)) or None
    if value.strip().lower().startswith("data:") and not (tag == "img" and attribute == "src" and _IMAGE_DATA.match(value)):
        return None
    return value


def safe_html(text: str) -> str:
    """``text`` with only what shows kept, balanced, so it can be nested in the saved snapshot."""
    return nh3.clean(
        text,
        tags=set(TAGS),
        clean_content_tags={"script", "style"},
        attributes={tag: set(names) for tag, names in ATTRIBUTES.items()},
        attribute_filter=_keep,
        url_schemes=set(URL_SCHEMES),
        filter_style_properties=set(STYLE_PROPERTIES),
        link_rel="noopener noreferrer",
        strip_comments=True,
    )
