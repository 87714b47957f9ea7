"""A kernel whose ipykernel strands shell requests, mended where nbspawn is loaded.

ipykernel 7.0 to 7.3 (7.3 is the newest on Python 3.10) sends each shell reply with a raw
``send_multipart`` on the shell ROUTER socket, from the shell channel thread, while a ``ZMQStream``
reads requests off that same socket.  The raw send consumes the socket's edge-triggered wake-up, so a
request that arrives during it sits unread until another client connects (ipykernel#1554; fixed in
7.4 by ipykernel#1529, which sends the replies through the stream).  The cell just sent never starts
and the kernel reads Idle: to a user that is "my ``%%spawn`` cell hung".  Measured on 7.3 with bursts of
four pipelined ``kernel_info`` requests: stuck within 300 bursts in 2 of 3 kernels, and a world cell's
``%spawn stop`` stuck the same way in CI's floor job (ci61, stop 55's CI).

:func:`mend` makes such a kernel do what 7.4 does: the shell channel thread sends every reply through
the stream.  It touches nothing in any other version, nor in a 7.x whose parts are not where 7.0-7.3
keep them.
"""

from __future__ import annotations

import re
from typing import Any

STRANDING = ((7, 0), (7, 4))  # the ipykernel versions that send shell replies raw: [from, to)


def strands_requests(version: str) -> bool:
    """Whether ipykernel ``version`` sends its shell replies raw on the socket it reads requests from."""
    found = re.match(r"(\d+)\.(\d+)", version)
    return found is not None and STRANDING[0] <= (int(found[1]), int(found[2])) < STRANDING[1]


def mend(kernel: Any) -> bool:
    """Send ``kernel``'s shell replies through its shell stream from now on, if its ipykernel strands
    requests; whether it is mended now (at once, on the shell channel thread, which owns the stream)."""
    import ipykernel

    if not strands_requests(ipykernel.__version__):
        return False
    manager = getattr(getattr(kernel, "shell_channel_thread", None), "_manager", None)  # made at the kernel's start
    stream = getattr(kernel, "shell_stream", None)
    if manager is None or stream is None or getattr(manager, "_shell_socket", None) is not stream.socket:
        return False  # not the parts 7.0-7.3 have: leave it as it is
    if getattr(manager, "_nbspawn_sends_through_the_stream", False):
        return True

    def send(msg: list[Any]) -> None:
        stream.send_multipart(msg)

    def through_the_stream() -> None:
        loop = manager._shell_channel_io_loop
        manager._send_on_shell_channel = send  # what each subshell made from now on is given
        manager._main_to_shell_channel.on_recv(loop, send)  # the main shell's replies
        with manager._lock_cache:
            for subshell in manager._cache.values():  # those of the subshells there are
                subshell.subshell_to_shell_channel.on_recv(loop, send)

    manager._nbspawn_sends_through_the_stream = True
    manager._shell_channel_io_loop.add_callback(through_the_stream)
    return True
