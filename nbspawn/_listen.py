"""Where nbspawn listens: only on the address it must be reached at, never on every interface.

torch's ``TCPStore``, asked for a port, listens on every interface (``*:PORT``), and it has no
authentication: anyone who reaches the port can read and write a run's rendezvous keys.  So the
store a run's ranks join is hosted by their launcher (the kernel on one machine, node 0's agent on a
cluster), as torchrun's agent hosts it, on a socket nbspawn bound itself and hands over
(``master_listen_fd``): ``127.0.0.1`` for a run on one machine, the address the nodes reach each
other at for a cluster.  The ranks join it as clients (``TORCHELASTIC_USE_AGENT_STORE``), so even a
rank's own ``init_process_group()`` never opens a listening store.

A port is *reserved* when it is chosen (a socket bound and listening, held here until a store takes
it over), so nothing else can take it between the choice and the run.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import os
import re
import socket
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

LOOPBACK = "127.0.0.1"
HELD_PORTS = 8  # reserved ports held at once; the oldest is let go (a spec that was never run, a kernel long gone)
STORE_TIMEOUT = timedelta(seconds=300)

# port -> its listening socket, newest last: a cluster's node 0 holds one per kernel (or client)
# that asked, since each remembers the port it was told (another kernel's probe must not free it)
_held: dict[int, socket.socket] = {}


def listener(address: str, port: int = 0) -> socket.socket:
    """A TCP socket bound to ``address`` only, listening."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((address, port))
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    return sock


def reserve(address: str) -> int:
    """A free port of ``address``, held (listening) until :func:`host_store` takes it over."""
    sock = listener(address)
    port = int(sock.getsockname()[1])
    _held[port] = sock
    while len(_held) > HELD_PORTS:
        _held.pop(next(iter(_held))).close()
    return port


def release(port: int) -> None:
    """Let a reserved port go: the run it was chosen for was refused before it started."""
    sock = _held.pop(port, None)
    if sock is not None:
        sock.close()


def host_store(address: str, port: int) -> Any:
    """The run's ``TCPStore``, listening on ``address:port`` only (the reserved socket if it is still
    held, else one bound now); ranks join it as clients.  It stops when the object is dropped."""
    from torch.distributed import TCPStore

    sock = _held.pop(port, None) or listener(address, port)
    options: dict[str, Any] = {}
    if not libuv_takes_listen_fd(_torch_version()):
        options["use_libuv"] = False  # its libuv server only listens on a given socket from torch 2.8
    fd = sock.detach()
    try:
        return TCPStore(
            address, port, is_master=True, wait_for_workers=False, timeout=STORE_TIMEOUT, master_listen_fd=fd, **options
        )
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise


def libuv_takes_listen_fd(version: str) -> bool:
    """Whether torch ``version``'s libuv TCPStore server accepts on a socket it is given (pytorch
    #150215, torch 2.8).  Torch 2.4 made libuv the default without that support; for a listen fd its
    documented route is ``use_libuv=False``, the legacy server, which takes one in every version."""
    found = re.match(r"(\d+)\.(\d+)", version)
    return found is None or (int(found[1]), int(found[2])) >= (2, 8)


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


def interface_of(address: str) -> str | None:
    """The network interface that carries ``address`` (for GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME),
    among every address of every interface (``psutil.net_if_addrs``: secondary IPv4 addresses and IPv6
    ones too, which the ``SIOCGIFADDR`` ioctl, one primary IPv4 address an interface, never saw)."""
    import psutil

    return interface_with(address, psutil.net_if_addrs())


def interface_with(address: str, interfaces: Mapping[str, Iterable[Any]]) -> str | None:
    """The interface of ``interfaces`` (name -> its addresses, as ``psutil.net_if_addrs`` gives
    them: each with an ``address``) that has ``address``, IPv4 or IPv6, primary or not; an IPv6
    address's zone (``fe80::1%eth0``) is not part of it.  None: no interface has it."""
    wanted = _ip(address)
    if wanted is None:
        return None
    for name, addresses in interfaces.items():
        if any(_ip(str(getattr(entry, "address", ""))) == wanted for entry in addresses):
            return name
    return None


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """An IP address without its IPv6 zone; None for a MAC address or anything else."""
    try:
        return ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None


@functools.cache
def loopback_interface() -> str | None:
    """This machine's loopback interface (``lo``): where gloo and NCCL's sockets go on one machine."""
    return interface_of(LOOPBACK)
