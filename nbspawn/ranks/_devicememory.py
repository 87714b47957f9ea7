"""In every rank: what torch holds on each GPU it used, written down about once a second (issue #44).

The kernel samples a rank's CPU and host memory from ``/proc`` (``events._resources``); a GPU's memory
is the rank's caching allocator's to tell, and only the rank can ask it.  A daemon thread here looks
every :data:`SAMPLE_EVERY`: while CUDA is not initialized in this process (``torch.cuda.is_initialized``,
a Python flag) it does nothing else, so a rank that never used a GPU never starts CUDA because of it;
once it is, it reads the allocator's counters of each device (``memory_stats_as_nested_dict``: the
allocator's own bookkeeping under its lock, no CUDA call, ~0.1 ms) and writes
``device_memory.json`` (``_rankdir.DEVICE_MEMORY``) when they changed.  A device is listed once torch
reserved memory on it; its properties (name, total memory, UUID: which physical GPU it is, whatever
``CUDA_VISIBLE_DEVICES`` renumbered) are asked only then, of a device this process holds a context on,
with the thread's current device set to it first.

Two rules keep the thread from changing what the rank's own code sees (the fourth GPU review's warning):
it never triggers torch's lazy CUDA init (nbspawn's ``set_device(LOCAL_RANK)`` is queued there and
would run on this thread, leaving the main thread on cuda:0), since it does nothing until
``is_initialized()``, which torch sets only after the queued calls ran; and it makes no CUDA runtime
call on a device the rank holds no context on (a helper thread's device is 0 by default).

Each device's record: ``{"index", "gpu", "uuid", "name", "total", "allocated", "reserved",
"peak_allocated", "peak_reserved"}`` in bytes; ``gpu`` is the physical GPU's index where
``CUDA_VISIBLE_DEVICES`` says it (``"GPU 3"``), else the rank's own name for it (``"cuda:0"``).
The peaks are torch's (``max_memory_allocated``): since the process started, or since the user reset
them.

A rank that runs out of GPU memory writes one more sample at once (:func:`write_now`, from where it
records its error), so the kernel can say what each rank held on that GPU then.

Host memory too, at the cell's end (issue #57, item 8): the kernel samples ``/proc`` once a second, so a
cell of 0.04 s had no figure and one of 0.27 s a peak for some ranks only.  At the cell's start the
rank resets its resident peak (``/proc/self/clear_refs``, 5: Linux's high-water mark), and at its end
writes that peak (``VmHWM``) to ``memory_peak.json`` (:func:`cell_ended`): every rank's figure, however short
the cell, a kept world's rank's this cell's own.
"""

from __future__ import annotations

import _thread
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

from .._rankdir import DEVICE_MEMORY, MEMORY_PEAK, write_json
from ._stackdump import HELPER_THREAD_BLOCKS

SAMPLE_EVERY = 1.0  # seconds between looks

_lock = threading.Lock()
_state: dict[str, Any] = {"dir": "", "written": None, "started": False}


def watch(rank_dir: str) -> None:
    """From now on this rank's GPU memory is written to ``rank_dir`` (a kept world's rank points it at
    each cell's directory); the thread is started once per process."""
    # the cell's peak counts from here (not a Linux: no figure at the end)
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
        fh.write("5")
    with _lock:
        _state["dir"] = rank_dir
        _state["written"] = None  # a new directory gets its first sample even if nothing changed
        if _state["started"]:
            return
        _state["started"] = True
    # as ranks._watch: not threading.Thread.start(), which waits for the new thread to be scheduled
    _thread.start_new_thread(_loop, ())


def _loop() -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, HELPER_THREAD_BLOCKS)  # SIGINT and SIGTERM stay the main thread's
    wait = threading.Event()
    while True:
        wait.wait(SAMPLE_EVERY)
        with contextlib.suppress(Exception):  # never let this thread take the rank down
            write_now()


def write_now() -> None:
    """Sample the GPUs this process uses and write the record if it changed (nothing without CUDA)."""
    cuda = initialized_cuda()
    if cuda is None:
        return
    devices = sample(cuda, os.environ.get("CUDA_VISIBLE_DEVICES"))
    with _lock:  # one writer at a time: the thread, and a rank recording its out-of-memory error
        rank_dir = _state["dir"]
        if not rank_dir or devices == _state["written"]:
            return
        _state["written"] = devices
        with contextlib.suppress(OSError):  # a directory removed under it (a world's cell ended): the next one comes
            write_json(os.path.join(rank_dir, DEVICE_MEMORY), {"devices": devices})


def cell_ended() -> None:
    """The cell's peak resident memory (since :func:`watch`), written beside its other records."""
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/status", encoding="ascii") as fh:
            found = next((line.split()[1] for line in fh if line.startswith("VmHWM:")), None)
        if found is not None and _state["dir"]:
            write_json(os.path.join(_state["dir"], MEMORY_PEAK), {"hwm": int(found) * 1024})


def on_error(exc: BaseException) -> None:
    """A rank recording its error: if it is torch's CUDA out-of-memory, its figures now, written at once
    (never raising: the error record matters more)."""
    if type(exc).__name__ == "OutOfMemoryError":
        with contextlib.suppress(Exception):
            write_now()


def initialized_cuda() -> Any:
    """What the thread asks of CUDA (:class:`_TorchCuda`) if this process imported torch and initialized
    CUDA (never initializes it)."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        return _TorchCuda(torch) if cuda is not None and cuda.is_initialized() else None
    except Exception:
        return None


@contextlib.contextmanager
def on_a_held_device() -> Iterator[bool]:
    """For a helper thread about to make a CUDA runtime call (NCCL's flight recorder asks its entries'
    CUDA events): True, with the thread's device made one this rank holds a context on, so the call
    opens no context on GPU 0 (a new thread's device; the fourth GPU review's U1); False, having done
    nothing, where CUDA is not initialized (asking would initialize it on this thread) or the rank
    holds no context."""
    cuda = initialized_cuda()
    device = None if cuda is None else next((i for i in range(cuda.device_count()) if cuda.holds_context(i)), None)
    if device is None:
        yield False
        return
    with cuda.device(device):
        yield True


class _TorchCuda:
    """``torch.cuda``'s calls the thread makes (``device_count``, ``memory_stats_as_nested_dict``,
    ``device``, ``get_device_properties``), and the driver's word on whether this process holds a
    context on a device (``holds_context``), which ``torch.cuda`` does not offer. A stand-in GPU
    (tests/stand_in_gpu.py) offers the same five."""

    def __init__(self, torch: Any) -> None:
        self._torch = torch

    def __getattr__(self, name: str) -> Any:
        return getattr(self._torch.cuda, name)

    def holds_context(self, index: int) -> bool:
        """The driver's answer (it creates no context); where this torch cannot ask, memory it reserved
        there says it does."""
        has = getattr(self._torch._C, "_cuda_hasPrimaryContext", None)
        return has is None or bool(has(index))


def sample(cuda: Any, visible: str | None) -> list[dict[str, Any]]:
    """Each device torch reserved memory on in this process, as the module's docstring says."""
    devices = []
    for index in range(cuda.device_count()):
        stats = cuda.memory_stats_as_nested_dict(index)
        reserved = _counter(stats, "reserved_bytes")
        if not (reserved["current"] or reserved["peak"]):
            continue  # never used here: not asked anything more (no context of this process on it)
        if not cuda.holds_context(index):
            continue
        allocated = _counter(stats, "allocated_bytes")
        props = _properties(cuda, index)
        devices.append(
            {
                "index": index,
                "gpu": physical_name(index, visible),
                "uuid": str(getattr(props, "uuid", "") or ""),
                "name": str(getattr(props, "name", "") or ""),
                "total": int(getattr(props, "total_memory", 0) or 0),
                "allocated": allocated["current"],
                "reserved": reserved["current"],
                "peak_allocated": allocated["peak"],
                "peak_reserved": reserved["peak"],
            }
        )
    return devices


_properties_of: dict[int, Any] = {}  # a device's properties, asked once


def _properties(cuda: Any, index: int) -> Any:
    """Device ``index``'s properties, asked from this thread with the device made its own first.

    A new thread's current device is 0, and a CUDA runtime call made there would open a context on GPU
    0 in a rank that uses GPU 3 (CUDA 12 opens one at ``cudaSetDevice``): ``cuda.device(index)`` makes
    the thread's device the one asked about, where the process already holds a context
    (``holds_context``), so the thread opens none."""
    if index not in _properties_of:
        with cuda.device(index):
            _properties_of[index] = cuda.get_device_properties(index)
    return _properties_of[index]


def _counter(stats: dict[str, Any], name: str) -> dict[str, int]:
    """One of the allocator's counters, all pools together: ``{"current": ..., "peak": ...}``."""
    every = (stats.get(name) or {}).get("all") or {}
    return {"current": int(every.get("current", 0) or 0), "peak": int(every.get("peak", 0) or 0)}


def physical_name(index: int, visible: str | None) -> str:
    """``"GPU 3"``: the physical GPU the rank's device ``index`` is, where ``CUDA_VISIBLE_DEVICES``
    lists numbers (``"2,3"``: the rank's cuda:1 is GPU 3); ``"cuda:1"`` where it lists UUIDs or cannot
    say (its ``uuid`` still tells ranks' devices apart)."""
    if visible is None:
        return f"GPU {index}"
    listed = [part.strip() for part in visible.split(",")]
    if index < len(listed) and listed[index].isdigit():
        return f"GPU {int(listed[index])}"
    return f"cuda:{index}"
