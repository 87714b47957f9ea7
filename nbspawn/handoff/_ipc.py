"""The kernel's side of CUDA IPC: giving back, for a rank that is gone, the references it held.

torch hands a CUDA tensor to another process as an IPC handle plus a reference counter: every
``_share_cuda_()`` (one per rank a tensor is pickled for) sets a fresh int64 counter to 1 in a
shared-memory file of the kernel's (``CudaIPCTypes.cpp``, ``GetNewRefCountedSentData``), and only
the receiver's storage deleter decrements it (``StorageSharing.cpp``, ``THPStorage_newSharedCuda``).
While it is above 0 the kernel's block cannot be freed: ``del g`` puts it in torch's limbo and
``torch.cuda.ipc_collect()`` frees only blocks whose counter reached 0.  A rank that never frees its
storage (killed by a signal, stuck in a collective, never got as far as unpickling, or left through
``os._exit`` with a GPU that would not settle) leaves the kernel's memory allocated until the kernel
restarts.

So the kernel notes each counter as it pickles (the reduction carries its handle and offset:
:func:`counters_in`), and once every process it was pickled for is reaped, releases each counter
still above 0 (``torch.UntypedStorage._release_ipc_counter_cuda``, what torch's receiver calls for a
storage it already had), then collects.  No cooperation from a dead rank is needed, and a counter the
rank released itself reads 0 and is left alone.
"""

from __future__ import annotations

import contextlib
import os
import struct
from collections.abc import Callable, Iterable
from typing import Any

from .._cuda import collect_ipc

SHM_DIR = "/dev/shm"
# the counters file is a torch RefcountedMapAllocator mapping: its own refcount header (map_alloc_alignment,
# 64 bytes) comes first, then the int64 counters (MapAllocator.cpp, RefcountedMapAllocator::data)
HEADER = 64

Counter = tuple[bytes, int]  # (ref_counter_handle, ref_counter_offset) as torch's reduction carries them


def counters_in(reduced: Any) -> list[Counter]:
    """The reference counters a tensor's reduction carries: ``rebuild_cuda_tensor``'s arguments 11 and
    12, wherever it appears in the reduction (a sparse or nested tensor nests its parts')."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    found: list[Counter] = []

    def walk(value: Any, depth: int) -> None:
        if not isinstance(value, tuple) or depth > 8:
            return
        if len(value) == 2 and value[0] is rebuild_cuda_tensor and isinstance(value[1], tuple):
            args = value[1]
            if len(args) > 12 and isinstance(args[11], bytes) and isinstance(args[12], int) and args[7] is not None:
                found.append((args[11], args[12]))
            return
        for item in value:
            walk(item, depth + 1)

    walk(reduced, 0)
    return found


def read_counter(handle: bytes, offset: int) -> int | None:
    """The counter's value now, read from the kernel's counters file; None once the file is gone
    (torch removes it when none of its counters is in use: nothing left to release)."""
    try:
        fd = os.open(SHM_DIR + os.fsdecode(handle), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        raw = os.pread(fd, 8, HEADER + 8 * offset)
    finally:
        os.close(fd)
    return struct.unpack("=q", raw)[0] if len(raw) == 8 else None


def release_counter(handle: bytes, offset: int) -> None:
    """Decrement one counter, as the receiving process would have (torch's own call for it)."""
    torch_release(handle, offset)


def torch_release(handle: bytes, offset: int) -> None:
    """torch's call that decrements a counter: ``UntypedStorage._release_ipc_counter``, the wrapper its
    binding sits behind (``_release_ipc_counter_cuda``, renamed ``_release_ipc_counter_device`` on
    torch's main), else the binding itself.  Raises AttributeError where this torch has neither, which
    a unit test asserts never happens (the ledger swallows errors: a rename would leak in silence)."""
    import torch

    storage = torch.UntypedStorage
    release = getattr(storage, "_release_ipc_counter", None) or storage._release_ipc_counter_cuda
    release(handle, offset)


class Ledger:
    """The counters of what the kernel sent to a set of processes, to give back once they are reaped."""

    def __init__(
        self,
        read: Callable[[bytes, int], int | None] = read_counter,
        release: Callable[[bytes, int], None] = release_counter,
        collect: Callable[[], None] = collect_ipc,
    ) -> None:
        self.counters: list[Counter] = []
        self._read, self._release, self._collect = read, release, collect

    def note(self, counters: Iterable[Counter]) -> None:
        self.counters.extend(counters)

    def prune(self) -> None:
        """Forget the counters the receivers released themselves (a world's between cells: bounded)."""
        self.counters = [c for c in self.counters if (self._read(*c) or 0) > 0]

    def release(self) -> int:
        """Every receiver is reaped: release each counter still held for it, then free what that lets
        go.  How many were released."""
        counters, self.counters = self.counters, []
        released = 0
        for handle, offset in counters:
            value = self._read(handle, offset)
            if value is not None and value > 0:  # 1 per share (torch never counts one up); 0 once released
                with contextlib.suppress(Exception):  # best effort: torch itself ignores a file gone
                    self._release(handle, offset)
                    released += 1
        if counters:
            self._collect()
        return released
