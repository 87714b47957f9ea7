"""Where the kernel runs: Colab's or Kaggle's hosted runtime, and what nbspawn does differently there.

Those runtimes ship their own (older) kernel stack and front end: IPython 7.34, ipykernel 6.17, ipywidgets
7.7 (Colab) or 8.1 (Kaggle), and no JupyterLab 4 to load nbspawn's extension.  The live view still draws
(through anywidget), but a few things are not what the README's JupyterLab screenshots show, so
``%load_ext nbspawn`` says so once, in one line.  Pure functions of the environment, for the tests.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Literal

Host = Literal["colab", "kaggle"]


def hosted_runtime(environ: Mapping[str, str] = os.environ, modules: Mapping[str, object] = sys.modules) -> Host | None:
    """Colab sets ``COLAB_RELEASE_TAG`` (and its kernel imports ``google.colab``); Kaggle sets ``KAGGLE_KERNEL_RUN_TYPE``."""
    if "COLAB_RELEASE_TAG" in environ or "google.colab" in modules:
        return "colab"
    if "KAGGLE_KERNEL_RUN_TYPE" in environ or "KAGGLE_URL_BASE" in environ:
        return "kaggle"
    return None


def tpu_named(environ: Mapping[str, str]) -> bool:
    """Whether the environment names a TPU VM (Kaggle's and Colab's TPU runtimes set one of these)."""
    return any(key in environ for key in ("TPU_ACCELERATOR_TYPE", "COLAB_TPU_ADDR", "TPU_NAME"))


def notice(host: Host | None, environ: Mapping[str, str] = os.environ) -> str | None:
    """The one line ``%load_ext nbspawn`` prints on a hosted runtime (None elsewhere)."""
    if host is None:
        return None
    parts = []
    if host == "colab":
        parts.append("the live view draws through Colab's custom widget manager (anywidget turns it on)")
    else:
        parts.append("the live view draws through the page's widget manager")
    parts.append(
        "a finished run stays as static HTML; the toolbar item and redrawing a run after a page reload need"
        " JupyterLab 4 with nbspawn's extension"
    )
    if tpu_named(environ):
        parts.append(
            "TPU runtime: -n auto starts one rank per chip, each set up as torch_xla's xmp.spawn sets its workers"
            " (run %%spawn before using an XLA device in the kernel)"
        )
    elif host == "kaggle":
        parts.append("Kaggle's 2 T4s talk over PCIe (no NVLink)")
    return f"nbspawn on {host.capitalize()}: " + "; ".join(parts) + "."
