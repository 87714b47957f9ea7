"""The kernel's comms, on every ipykernel nbspawn supports.

ipykernel 6.18 moved comms into the ``comm`` package (``comm.create_comm``, ``comm.get_comm_manager``).
Colab and Kaggle ship ipykernel 6.17.1, where a comm is ``ipykernel.comm.Comm`` and the kernel owns its
``comm_manager``; Colab does not even install ``comm``, and where ``comm`` is installed beside 6.17 (Kaggle,
for ipywidgets 8) its ``create_comm`` makes a comm that talks to nobody.  ipywidgets makes the same switch
(its ``comm.py``); everything of nbspawn's that opens a comm asks here.
"""

from __future__ import annotations

import functools
from typing import Any

from ._shell import running_kernel


@functools.cache
def kernel_owns_comms() -> bool:
    """ipykernel < 6.18: comms are ``ipykernel.comm.Comm`` and ``kernel.comm_manager``, not ``comm``'s."""
    try:
        import ipykernel
    except ImportError:  # pragma: no cover - ipykernel is a dependency
        return False
    return tuple(ipykernel.version_info[:2]) < (6, 18)


def create_comm(target_name: str, data: Any = None) -> Any:
    """A comm to the front end, opened at once with ``data``."""
    if kernel_owns_comms():
        from ipykernel.comm import Comm

        return Comm(target_name=target_name, data=data)
    from comm import create_comm as create

    return create(target_name=target_name, data=data)


def listed_comm(target_name: str, comm_id: str) -> Any:
    """A comm of ``target_name`` the kernel lists (a ``comm_info_request`` for that target names it) but
    never opened with a front end: no message is sent for it, ever (``primary=False``: its peer is no page).
    It tells a page that asks before opening a comm of its own that the target is registered here."""
    listed: Any
    if kernel_owns_comms():
        from ipykernel.comm import Comm

        listed = Comm(target_name=target_name, comm_id=comm_id, primary=False)
    else:
        from comm import create_comm as create

        listed = create(target_name=target_name, comm_id=comm_id, primary=False)
    comm_manager().register_comm(listed)
    return listed


def comm_manager() -> Any:
    """The manager that routes a front end's ``comm_open`` to a registered target."""
    if kernel_owns_comms():
        kernel = running_kernel()
        if kernel is None:
            raise RuntimeError("no kernel: comms need one")
        return kernel.comm_manager
    from comm import get_comm_manager

    return get_comm_manager()
