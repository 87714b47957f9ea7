"""Who sent a SIGTERM: Linux's ``signal:signal_generate`` tracepoint, on for a test session where root
can turn it on (CI is root), read when a test finds a rank "killed by SIGTERM" that it never stopped.

A rank cannot tell: Python's handlers are not given the sender (``si_pid``), and a rank killed by the
signal's default action writes nothing.  A fork world's rank 1 died so in ci60 and ci64 with empty
stderr and stacks, which nbspawn's own stop never leaves (it asks for stacks first); the tracepoint
names the sending process and thread, and costs nothing measurable at a few hundred signals a phase.

Only the session's controller turns it on and off (xdist workers read); only this one event's enable
and filter are touched, and the trace buffer is read, never cleared.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

TRACEFS = Path("/sys/kernel/tracing")
EVENT = TRACEFS / "events" / "signal" / "signal_generate"
_LINE = re.compile(r"^\s*(?P<sender>.+?)-(?P<tid>\d+)\s+\[\d+\]\s+\S+\s+(?P<at>[\d.]+): signal_generate: (?P<what>.*)$")


def start() -> bool:
    """Record every SIGTERM sent on this machine from now on; False where that cannot be done here."""
    if os.geteuid() != 0:
        return False
    if not EVENT.exists():
        subprocess.run(["mount", "-t", "tracefs", "nodev", str(TRACEFS)], capture_output=True, check=False)
    try:
        (EVENT / "filter").write_text("sig == 15\n")
        (EVENT / "enable").write_text("1\n")
        (TRACEFS / "tracing_on").write_text("1\n")
    except OSError:
        return False
    return True


def stop() -> None:
    try:
        (EVENT / "enable").write_text("0\n")
        (EVENT / "filter").write_text("0\n")
    except OSError:
        pass


def sigterms_to(comm: str = "nbspawn rank", last: int = 30) -> str:
    """The last SIGTERMs sent to processes whose name holds ``comm`` (a rank's title: ``nbspawn rank 1``),
    each as "sender-tid -> target pid", for a failure message; a line saying why where none can be read."""
    try:
        text = (TRACEFS / "trace").read_text(errors="replace")
    except OSError as exc:
        return f"(no signal trace: {exc})"
    found = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if m and comm in m["what"]:
            found.append(f"{m['at']}: {m['sender'].strip()}-{m['tid']} -> {m['what']}")
    if not found:
        return "(no SIGTERM to such a process in the signal trace)"
    return "SIGTERMs to ranks, by sender (signal trace):\n" + "\n".join(found[-last:])
