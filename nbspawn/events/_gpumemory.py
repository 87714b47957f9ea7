"""What each rank holds on the GPUs, read from the records its thread writes (``ranks._devicememory``),
and put into words: the GPUs' totals against what each has, and, when a rank runs out of GPU memory,
what every rank held on that GPU then (issue #44).

Pure but for :func:`read_held` (a file read): no torch, no CUDA, nothing the kernel must initialize.
A physical GPU is told apart by its UUID (two ranks' ``cuda:0`` may be two GPUs), its name by the
physical index where ``CUDA_VISIBLE_DEVICES`` said it (``"GPU 3"``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ._resources import gigabytes


@dataclass(frozen=True)
class DeviceHeld:
    """What one rank's torch holds on one GPU, in bytes (its peaks are torch's: since the process
    started, unless reset)."""

    index: int  # the rank's own number for it (cuda:N)
    gpu: str  # "GPU 3" (or the rank's "cuda:0" where the physical index is not known)
    uuid: str
    name: str  # "NVIDIA H100 80GB HBM3"
    total: int
    allocated: int
    reserved: int
    peak_allocated: int
    peak_reserved: int

    @property
    def key(self) -> str:
        """Which physical GPU it is."""
        return self.uuid or self.gpu


@dataclass(frozen=True)
class GpuTotal:
    """One physical GPU: what the ranks' torch reserved on it together, of its total."""

    key: str  # its UUID (DeviceHeld.key)
    gpu: str
    name: str
    total: int
    reserved: int
    ranks: tuple[int, ...]


def parse_held(devices: Iterable[object]) -> tuple[DeviceHeld, ...]:
    """A rank's record's devices (``ranks._devicememory.sample``); malformed entries are left out."""
    held = []
    for device in devices:
        if not isinstance(device, Mapping):
            continue
        try:
            held.append(
                DeviceHeld(
                    index=int(device["index"]),
                    gpu=str(device["gpu"]),
                    uuid=str(device.get("uuid") or ""),
                    name=str(device.get("name") or ""),
                    total=int(device.get("total") or 0),
                    allocated=int(device["allocated"]),
                    reserved=int(device["reserved"]),
                    peak_allocated=int(device.get("peak_allocated") or device["allocated"]),
                    peak_reserved=int(device.get("peak_reserved") or device["reserved"]),
                )
            )
        except (KeyError, TypeError, ValueError):
            continue
    return tuple(held)


def read_held(path: str) -> tuple[DeviceHeld, ...] | None:
    """A rank's last record (``_rankdir.DEVICE_MEMORY``); None where it wrote none (no GPU used)."""
    try:
        with open(path, encoding="utf-8") as fh:
            devices = json.load(fh).get("devices")
    except (OSError, ValueError, AttributeError):
        return None
    return parse_held(devices) if isinstance(devices, list) else None


def gpu_names(held: Sequence[DeviceHeld]) -> str | None:
    """``"GPU 0"``, ``"GPU 0, GPU 1"``: the GPUs a rank uses; None for none."""
    return ", ".join(dict.fromkeys(device.gpu for device in held)) or None


def totals(held_by_rank: Mapping[int, Sequence[DeviceHeld]]) -> list[GpuTotal]:
    """Each physical GPU the ranks use, in the order first seen: the sum of what they reserved on it now."""
    found: dict[str, GpuTotal] = {}
    for rank in sorted(held_by_rank):
        for device in held_by_rank[rank]:
            before = found.get(device.key)
            if before is None:
                found[device.key] = GpuTotal(device.key, device.gpu, device.name, device.total, device.reserved, (rank,))
            else:
                found[device.key] = GpuTotal(
                    before.key,
                    before.gpu,
                    before.name,
                    before.total or device.total,
                    before.reserved + device.reserved,
                    (*before.ranks, rank),
                )
    return list(found.values())


# torch's CUDA out-of-memory message names the device in the rank's own numbering:
# "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which ..."
_OOM_DEVICE = re.compile(r"\bGPU (\d+) has a total capacity\b")


def is_cuda_out_of_memory(exc_type: str | None, message: str | None) -> bool:
    """A rank's error is torch's CUDA out-of-memory error (``torch.OutOfMemoryError``, once
    ``torch.cuda.OutOfMemoryError``), not the host's ``MemoryError``."""
    return bool(exc_type) and str(exc_type).rsplit(".", 1)[-1] == "OutOfMemoryError" and "out of memory" in (message or "")


def out_of_memory_words(rank: int, message: str | None, held_by_rank: Mapping[int, Sequence[DeviceHeld]]) -> str | None:
    """What each rank held on the GPU ``rank`` ran out of memory on: "rank 2 ran out of memory on
    GPU 0 (NVIDIA T4, 15.8 GB): rank 0 held 3.1 GB, rank 2 12.2 GB (reserved by torch; 15.3 GB in
    all)"; None where the rank's GPU was not sampled."""
    own = held_by_rank.get(rank) or ()
    if not own:
        return None
    said = _OOM_DEVICE.search(message or "")
    device = next((d for d in own if said and d.index == int(said.group(1))), None) or max(own, key=lambda d: d.reserved)
    sharers = [(other, d) for other in sorted(held_by_rank) for d in held_by_rank[other] if d.key == device.key]
    what = f"{device.gpu} ({device.name}, {gigabytes(device.total)})" if device.name and device.total else device.gpu
    each = ", ".join(
        f"rank {other} {gigabytes(d.reserved)}" if n else f"rank {other} held {gigabytes(d.reserved)}"
        for n, (other, d) in enumerate(sharers)
    )
    in_all = sum(d.reserved for _, d in sharers)
    return f"rank {rank} ran out of memory on {what}: {each} (reserved by torch" + (
        f"; {gigabytes(in_all)} in all)" if len(sharers) > 1 else ")"
    )
