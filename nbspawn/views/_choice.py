"""Which view shows a run: one choice for ``%%spawn``'s ``--view`` and for ``nbspawn.spawn``.

``auto`` is the live widget in a Jupyter kernel, the run's panes in a marimo notebook (``_marimo``:
marimo has no Jupyter display or comms), and ``[rank{r}]:`` lines anywhere else (terminal IPython, a
script); ``widget`` and ``text`` are what they say.
"""

from __future__ import annotations

from typing import Any

from .._options import ROW, ViewChoice
from .._shell import kernel_of
from ..errors import SpawnUsageError
from ._marimo import MarimoView, in_marimo
from ._protocol import RunView
from ._text import TextView


def view_for(shell: Any, choice: ViewChoice = ROW["view"].typed_default, live_after: float | None = None) -> RunView:
    """The view for a run started from ``shell`` (IPython's, or None); ``live_after``: the widget's
    delay before it shows (None: its default)."""
    if choice == "auto" and in_marimo():
        return MarimoView()
    if choice == "widget" or (choice == "auto" and kernel_of(shell) is not None):
        from ._widget import LIVE_AFTER, WidgetView, widget_available

        if widget_available():
            return WidgetView(live_after=LIVE_AFTER if live_after is None else live_after)
        if choice == "widget":
            raise SpawnUsageError("--view widget: the widget's front end was not built (run `make lab` or `pip install .`)")
    return TextView()
