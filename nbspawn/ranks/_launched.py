"""What a rank looks like to libraries that ask "am I interactive?": a worker torchrun launched.

IPython sets ``sys.ps1`` (``InteractiveShell.init_prompts``): a forked rank inherits it from the kernel
and a spawned one gets it from the shell made for display().  Lightning reads it as "a notebook"
(``lightning.fabric.utilities.imports._IS_INTERACTIVE``) and then refuses ``strategy="ddp"`` or forks
processes of its own inside the rank.  A rank is a launched worker: it has the torchelastic environment
(``TORCHELASTIC_RUN_ID``, which Lightning's ``TorchElasticEnvironment`` detects), no prompt, and no
terminal.  Rich display does not depend on the prompt (``get_ipython()`` and the ``IPKernelApp`` config
say "notebook" to tqdm and friends).

One module reads the flag for drawing only: Lightning's ``RichProgressBar`` redraws on every update
where it is interactive, and otherwise leaves drawing to a refresh thread that is stopped, in a
notebook, without a last frame (rich's ``Live.stop`` does not redraw there): a finished fit would read
``Epoch 1/1 0/8`` for good.  In a rank that draws as a notebook (the widget view) that module keeps
the notebook's answer, so its bar ends where the training did.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType

_LIGHTNING_FLAGS = ("lightning.fabric.utilities.imports", "lightning_fabric.utilities.imports")
_LIGHTNING_PACKAGES = ("lightning.", "lightning_fabric.", "pytorch_lightning.")
_RICH_BARS = ("lightning.pytorch.callbacks.progress.rich_progress", "pytorch_lightning.callbacks.progress.rich_progress")


def look_launched(draws_as_a_notebook: bool) -> None:
    """No prompt, and Lightning's inherited flag cleared, but in the rich bar's module where the rank
    draws as a notebook (imported already, or when it is)."""
    for name in ("ps1", "ps2", "ps3"):
        if hasattr(sys, name):
            delattr(sys, name)
    if draws_as_a_notebook:
        sys.meta_path.insert(0, _RichBarDrawsEveryUpdate())
    # Lightning imported in the kernel before the fork decided at import time, in every module that
    # copied the flag (``from lightning.fabric.utilities.imports import _IS_INTERACTIVE``)
    if not any(name in sys.modules for name in _LIGHTNING_FLAGS):
        return
    for name, module in list(sys.modules.items()):
        if name.startswith(_LIGHTNING_PACKAGES) and getattr(module, "_IS_INTERACTIVE", None) is True:
            module._IS_INTERACTIVE = draws_as_a_notebook and name in _RICH_BARS  # type: ignore[attr-defined]


class _RichBarDrawsEveryUpdate(importlib.abc.MetaPathFinder):
    """Finds the rich bar's module as Python would, and sets its flag once it has run."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _RICH_BARS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            module._IS_INTERACTIVE = True  # type: ignore[attr-defined]

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec
