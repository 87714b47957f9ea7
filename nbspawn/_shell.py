"""The IPython shell this process runs, if any: the one place that asks, for every part that talks to
the kernel (its display publisher, its status messages, its comms, whether it can answer ``input()``).

A process that never imported IPython (a script calling ``launch()``, a plain program's rank) has no
shell, and asking is not made to import it (IPython takes ~0.1 s to import).
"""

from __future__ import annotations

import os
import sys
from typing import Any


def running_shell() -> Any:
    """IPython's shell of this process (a kernel's, a terminal's), or None."""
    if "IPython" not in sys.modules:
        return None
    from IPython import get_ipython

    return get_ipython()


def running_kernel() -> Any:
    """The Jupyter kernel this process is (ipykernel's ``Kernel``, the shell's ``kernel``), or None."""
    return kernel_of(running_shell())


def kernel_of(shell: Any) -> Any:
    """The Jupyter kernel ``shell`` serves (ipykernel's ``Kernel``), or None: a terminal's shell, or
    no shell at all, has none.  The one place that asks a shell for it."""
    return getattr(shell, "kernel", None)


def wants_colour(stream: Any = None) -> bool:
    """Whether what nbspawn writes to ``stream`` (stdout if None) may carry colour codes: not when
    ``NO_COLOR`` is set (no-color.org: any non-empty value), not when IPython's colours are off
    (``--colors=nocolor``, ``%colors nocolor``), and, outside a kernel (whose frontend draws the
    codes), not when the stream is no terminal (``ipython script.ipy > out.txt``)."""
    if os.environ.get("NO_COLOR"):
        return False
    shell = running_shell()
    if shell is not None and str(getattr(shell, "colors", "")).lower() == "nocolor":
        return False
    if running_kernel() is not None:
        return True
    try:
        return bool((stream or sys.stdout).isatty())
    except (AttributeError, ValueError, OSError):
        return False
