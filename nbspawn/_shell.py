"""The IPython shell this process runs, if any: the one place that asks, for every part that talks to
the kernel (its display publisher, its status messages, its comms, whether it can answer ``input()``).

A process that never imported IPython (a script calling ``launch()``, a plain program's rank) has no
shell, and asking is not made to import it (IPython takes ~0.1 s to import).
"""

from __future__ import annotations

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
    return getattr(running_shell(), "kernel", None)
