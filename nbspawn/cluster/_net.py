"""Which address and interface a node's ranks should use, asked of the node's own kernel.

Never from the hostname: on Debian and Ubuntu a machine's own hostname resolves to 127.0.1.1, and a
MASTER_ADDR or a gloo device bound to it works on one machine and breaks across two
(``connectFullMesh failed``).  Instead the kernel's routing table is asked which source address it
would use to reach a peer (a UDP ``connect`` sends nothing), and that address's interface is found
among every address of every interface (``nbspawn._listen.interface_of``: secondary IPv4 and IPv6
addresses too).  Everything here runs on the node, inside its engine.
"""

from __future__ import annotations

import contextlib
import os
import socket

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
