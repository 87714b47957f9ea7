"""Which address and interface a node's ranks should use, asked of the node's own kernel.

Never from the hostname: on Debian and Ubuntu a machine's own hostname resolves to 127.0.1.1, and a
MASTER_ADDR or a gloo device bound to it works on one machine and breaks across two
(``connectFullMesh failed``).  Instead the kernel's routing table is asked which source address it
would use to reach a peer (a UDP ``connect`` sends nothing), and that address's interface is found
among every address of every interface (``psutil.net_if_addrs``: secondary IPv4 addresses and IPv6
ones too, which the ``SIOCGIFADDR`` ioctl, one primary IPv4 address an interface, never saw).
Everything here runs on the node, inside its engine.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
from collections.abc import Iterable, Mapping
from typing import Any

# not a real peer: asking the route toward it gives the address of the default route's interface
_FAR_AWAY = "10.254.254.254"


def node_name() -> str:
    """What tells nodes apart: the hostname, or ``NBSPAWN_NODE`` (engines posing as nodes in tests)."""
    return os.environ.get("NBSPAWN_NODE") or socket.gethostname()


def source_address(peer: str) -> str | None:
    """This machine's address on the route toward ``peer`` (IPv4 or IPv6); None if there is no route."""
    family = socket.AF_INET6 if ":" in peer else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.connect((peer, 9))
            return str(sock.getsockname()[0])
    except OSError:
        return None


def routable_address(controller_host: str | None) -> str | None:
    """The address other nodes can reach this one at: the one it reaches the controller from (every
    node reaches the controller), else the default route's; never loopback. None: none found."""
    for peer in (controller_host, _FAR_AWAY):
        if not peer:
            continue
        with contextlib.suppress(OSError):
            peer = socket.gethostbyname(peer)
        address = source_address(peer)
        if address and not address.startswith("127."):
            return address
    return None


def interface_of(address: str) -> str | None:
    """The network interface that carries ``address`` (for GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME)."""
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


def url_host(url: str) -> str | None:
    """``tcp://10.0.0.1:12345`` -> ``10.0.0.1`` (None for an empty url)."""
    return url.split("://", 1)[-1].rsplit(":", 1)[0] or None


def engine_controller_host() -> str | None:
    """The controller's host as this engine registered with it, when this process is an engine."""
    try:
        from ipyparallel.engine.app import IPEngine

        if IPEngine.initialized():
            return url_host(IPEngine.instance().registration_url)
    except Exception:
        return None
    return None
