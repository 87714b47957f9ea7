"""In every rank: where it is in its collectives, written down whenever the kernel asks where it is.

The kernel asks a rank where it is with SIGUSR1, which appends the rank's stacks to ``stacks.log``
(``ranks._stackdump``); then the rank's recent collectives are written beside it
(``collectives.json``), from torch's flight recorder: each one's sequence number, op, input sizes and
when it was issued.  From Python 3.11 the thread that dumped the stacks writes them at once
(:func:`write_beside`); before, faulthandler's C handler dumps and tells nobody, so a daemon thread
here notices the file grow (it looks four times a second: an ``fstat``).  Either thread runs while
the main thread is blocked in a collective (torch releases the GIL there), which is when it matters.
The kernel reads the two together: the stacks say *where* each rank is, the sequence numbers *how
far* it got (``rank 2 never entered barrier #3``).

torch's flight recorders (NCCL's own, and the generic one gloo records into) keep the last
``TORCH_FR_BUFFER_SIZE`` collectives of every process group; ranks get a small buffer unless the user set one.  It costs a few microseconds per collective.
"""

from __future__ import annotations

import _thread
import json
import os
import signal
import sys
import time
from collections.abc import Callable, MutableMapping
from typing import Any, TextIO

from .._cuda import recorder_renamed
from .._rankdir import COLLECTIVES, write_json
from . import _devicememory, _xray
from ._stackdump import HELPER_THREAD_BLOCKS, answer_stack_requests

FR_ENTRIES = "256"  # the flight recorders' size unless the user set it
# where torch reads it: TORCH_FR_BUFFER_SIZE since the FlightRecorder rename (and warns on every rank of the
# old name when that is set); NCCL's recorder before it read only TORCH_NCCL_TRACE_BUFFER_SIZE, default 0 (off)
FR_SIZE_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
LOOK_EVERY = 0.25
KEPT = 8  # the newest collectives written down (with each group's oldest one not completed)

_started = False


def answer_where(stack_file: TextIO, entries: str = FR_ENTRIES) -> None:
    """From now on the kernel's "where are you?" (SIGUSR1) is answered: every thread's stack appended
    to ``stack_file`` (``ranks._stackdump``), then the rank's recent collectives beside it.  Called on
    the main thread, once per process, once ``stack_file`` is open.

    From Python 3.11 the thread that dumps the stacks calls :func:`write_beside` itself, so the
    collectives are there as soon as the stacks; before, a thread here watches the file grow."""
    global _started
    recorder_env(os.environ, entries=entries)
    if answer_stack_requests(stack_file, then=write_beside) or _started:
        return
    _started = True
    # not threading.Thread.start(): it waits until the new thread has been scheduled, which on a
    # machine busy with a run's freshly forked ranks took 1.8 ms of every rank's start (the thread
    # needs no handshake: it only sleeps and looks; like a daemon thread it never holds up an exit)
    _thread.start_new_thread(_loop, (stack_file,))


def recorder_env(environ: MutableMapping[str, str], renamed: bool | None = None, entries: str = FR_ENTRIES) -> None:
    """torch's flight recorders on, ``entries`` long (small, but for the X-ray's drained ring), unless the user sized them (either variable: torch reads the
    first set one).  Only the name this torch reads is set: the old one on a torch from after the rename
    prints a deprecation warning in every rank (``renamed``: whether it is such a torch; asked of the
    torch this rank imported when not given)."""
    if any(key in environ for key in FR_SIZE_VARS):
        return
    if renamed is None:
        renamed = recorder_renamed()  # a rank has imported torch (torch's start_processes started it)
    environ.update(dict.fromkeys(FR_SIZE_VARS[:1] if renamed else FR_SIZE_VARS, entries))


def _loop(stack_file: TextIO) -> None:
    # the process's SIGINT and SIGTERM are the main thread's: one the kernel handed this thread would
    # not wake a main thread asleep in the cell (time.sleep), so its KeyboardInterrupt would wait
    signal.pthread_sigmask(signal.SIG_BLOCK, HELPER_THREAD_BLOCKS)
    seen: dict[tuple[int, int], int] = {}  # the file (device, inode) -> its size when last looked at
    while True:
        time.sleep(LOOK_EVERY)
        try:
            stat = os.fstat(stack_file.fileno())
        except (OSError, ValueError):
            continue
        key = (stat.st_dev, stat.st_ino)
        if key in seen and stat.st_size > seen[key]:  # a dump was appended: the kernel is asking
            write_beside(stack_file)
        seen[key] = stat.st_size


def write_beside(stack_file: TextIO) -> None:
    """Just after a dump to ``stack_file``: the rank's recent collectives, beside it."""
    try:
        fd = stack_file.fileno()
        size = os.fstat(fd).st_size
    except (OSError, ValueError):
        return
    _write(os.path.dirname(os.path.realpath(f"/proc/self/fd/{fd}")), size)


def _write(rank_dir: str, asked: int) -> None:
    try:
        entries = recent_collectives()
    except Exception as err:  # never let this thread take the rank down
        entries = [{"error": f"{type(err).__name__}: {err}"}]
    record = {"asked": asked, "time": time.time(), "entries": entries}
    path = os.path.join(rank_dir, COLLECTIVES)
    try:
        write_json(path, record)
    except OSError:
        pass


def recent_collectives() -> list[dict[str, Any]]:
    """The newest collectives of this rank's process groups, from torch's flight recorders, oldest first."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return []
    import torch

    # not while the rank's groups are being made, as far as the X-ray's drainer has seen (_xray.GroupsWatch)
    waited = 0.0
    while not _xray.groups_settled():
        if waited >= 2 * _xray.SETTLED:
            raise RuntimeError("the rank was making process groups: their recorders were not read (torch's dump could crash it)")
        time.sleep(0.05)
        waited += 0.05
    # NCCL's recorder asks its entries' CUDA events: from this thread, on a device the rank holds a context on
    with _devicememory.on_a_held_device() as held:
        return collected(recorders(torch._C._distributed_c10d, held))


def collected(dumps: list[Callable[[], str]]) -> list[dict[str, Any]]:
    """What the recorders hold, summed up, oldest first: the :data:`KEPT` newest, and before them each
    group's oldest NCCL collective not completed, where it is older: a rank that goes on enqueuing
    work after the collective it is stuck in (no sync in its loop) would lose it from the newest."""
    entries: list[dict[str, Any]] = []
    failed: Exception | None = None
    for dump in dumps:
        try:
            entries.extend(json.loads(dump()).get("entries", []))
        except Exception as err:  # one recorder that cannot be read leaves the other's entries
            failed = err
    if failed is not None and not entries:
        raise failed
    entries.sort(key=lambda entry: entry.get("time_created_ns") or 0)
    stuck: dict[str, dict[str, Any]] = {}
    for entry in entries[:-KEPT]:
        name = str(entry.get("profiling_name", ""))
        if name.startswith("nccl:") and entry.get("state") != "completed":
            stuck.setdefault(str((entry.get("process_group") or [""])[0]), entry)
    return [summary(entry) for entry in [*stuck.values(), *entries[-KEPT:]]]


def recorders(c10d: Any, cuda_initialized: bool) -> list[Callable[[], str]]:
    """The flight recorders this rank's collectives are in, as dump functions.

    torch keeps two: ProcessGroupNCCL records into its own (``FlightRecorder<at::cuda::CUDAEvent>``,
    dumped by ``_dump_nccl_trace_json``, NCCL builds only); gloo and other CPU backends into the
    generic one (``FlightRecorder<c10::Event>``, ``_dump_fr_trace_json``).  Both are read: a rank
    may have groups of each.  The NCCL one only once CUDA is initialized (no NCCL group before), from
    a thread whose device the rank holds a context on (``_devicememory.on_a_held_device``)."""
    found: list[Callable[[], str]] = []
    nccl = getattr(c10d, "_dump_nccl_trace_json", None)
    if nccl is not None and cuda_initialized:
        found.append(lambda: nccl(True, False))  # includeCollectives, onlyActive
    generic = getattr(c10d, "_dump_fr_trace_json", None)
    if generic is not None:
        found.append(lambda: generic(includeCollectives=True))
    return found


def summary(entry: dict[str, Any]) -> dict[str, Any]:
    """What the kernel needs of one flight-recorder entry.  ``state`` (scheduled, started,
    completed) is meaningful for NCCL's entries, whose end is a CUDA event: an NCCL collective
    returns once enqueued, so "not completed" is how a rank is seen waiting in one."""
    name = str(entry.get("profiling_name", ""))
    return {
        "seq": entry.get("collective_seq_id") or 0,
        "p2p_seq": entry.get("p2p_seq_id") or 0,
        "op": name.split(":", 1)[-1],  # "gloo:all_reduce" -> "all_reduce"
        "backend": name.split(":", 1)[0] if ":" in name else "",
        "group": (entry.get("process_group") or ["", ""])[-1],  # its description: default_pg is the world's
        "pg": str((entry.get("process_group") or [""])[0]),  # its name, unique in the rank: sequence numbers are per group
        "sizes": entry.get("input_sizes") or [],
        "issued": (entry.get("time_created_ns") or 0) / 1e9,
        "state": entry.get("state"),
        "timeout": (entry.get("timeout_ms") or 0) / 1000,  # when torch's watchdog ends it (0: not recorded)
    }
