"""The supervisor's room for what the ranks cost (issue #44): sampled about once a second from the
kernel's side (``events._resources``), kept on each rank's state (CPU now, resident memory now and
its peak), the machine's or container's memory beside them, one warning when the ranks near it, and a
rank killed for memory named as such rather than as a bare SIGKILL.  What a rank holds on a GPU is
its own thread's record (``ranks._devicememory``), read here with the rest; a rank that runs out of
GPU memory is told with what every rank held on that GPU.

The ranks are made the out-of-memory killer's first choice (``oom_score_adj`` 500 above the
kernel's): when memory runs out, a rank goes, not the kernel with the notebook's state.  And they run
at a lower CPU priority than the kernel (``SpawnMagics.rank_niceness`` added to its nice value, 19 by
default), as Ray's workers do (15): when ranks outnumber the cores, the kernel that relays their
output and answers Stop, the notebook's server and a browser on the same machine get a core first.
At 19 (a scheduler weight of 15 against a nice-0 process's 1024) even 16 busy ranks weigh less
together than one such process; at 10 (weight 110) they weighed 1760, and a 16-rank flood still
kept the page's renderer waiting for a core for 13.8 s of a 20.6 s typing test (ci75).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..events._gpumemory import DeviceHeld, out_of_memory_words, parse_held, read_held, totals
from ..events._resources import (
    CpuMark,
    MemoryLimit,
    cpu_percent,
    gigabytes,
    lower_cpu_priority,
    memory_limit,
    oom_kills,
    raise_oom_score,
    read_processes,
    tree_totals,
)

if TYPE_CHECKING:
    from .._runstate import RankState, Run
    from ..views._protocol import RunView

SAMPLE_EVERY = 1.0  # seconds between samples
WARN_AT = 0.85  # the share of the machine's (or container's) memory in use that earns one warning
NEAR_LIMIT = 0.9  # a rank killed by SIGKILL with this share in use at the last sample was killed for memory


class ResourceWatch:
    """One run's figures: call :meth:`ranks_started`, then :meth:`sample` on every turn of the loop."""

    def __init__(self, run: Run, view: RunView, enabled: bool = True) -> None:
        self.run = run
        self.view = view
        self.enabled = enabled  # a cluster's ranks are other machines' processes: their agents sample them (relayed)
        self.told: dict[int, str] = {}  # a node's rank killed for memory, or out of GPU memory: its agent's words
        self.sampled_at = 0.0
        self.cpu_before: dict[int, CpuMark] = {}  # rank -> its CPU seconds at the last sample
        self.oom_before = 0
        self.gpu_read: dict[int, float] = {}  # rank -> the modification time of the GPU record read last
        # a fresh run's ranks began with it: torch's peaks are the run's; a kept world's go back to its first cell
        self.torch_peaks_are_the_runs = run.world is None

    def ranks_started(self) -> None:
        if not self.enabled:
            return
        self.oom_before = oom_kills()
        for state in self.run.ranks:
            if state.pid and state.status != "absent":
                raise_oom_score(state.pid)
                lower_cpu_priority(state.pid, self.run.spec.asked.rank_niceness)
        self.sample(force=True, ranks_alone=True)

    def sample(self, force: bool = False, ranks_alone: bool = False) -> None:
        """The ranks' figures now, if a second has gone by since the last (or ``force``).

        ``ranks_alone``: the ranks' own processes, not what they started. The sample as ranks start reads
        only them: a full one reads every process on the machine to find the ranks' descendants (~120
        files here, ~7 ms of a kept world's ~18 ms cell in the kernel, cProfile 2026-12-02). What the
        ranks started (a kept world's rank keeps its DataLoader workers between cells) is counted a second
        later, by the loop's next sample, whose CPU percentage counts from the rank's own process then
        (:func:`~nbspawn.events._resources.cpu_percent`)."""
        now = time.monotonic()
        if not self.enabled or (not force and now - self.sampled_at < SAMPLE_EVERY):
            return
        self.sampled_at = now
        running = {s.rank: s.pid for s in self.run.ranks if s.pid and s.status in ("starting", "running")}
        if not running:
            return
        processes = read_processes(only=running.values() if ranks_alone else None)
        for rank, (cpu, rss) in tree_totals(processes, running).items():
            state = self.run.ranks[rank]
            percent = cpu_percent(self.cpu_before.get(rank), cpu, processes[running[rank]].cpu_seconds, now)
            if percent is not None:
                state.cpu_percent = percent
            self.cpu_before[rank] = CpuMark(cpu, now, alone=ranks_alone)
            state.rss = rss
            state.peak_rss = max(state.peak_rss or 0, rss)
        for rank in running:
            self.read_gpu(self.run.ranks[rank])
        self._note_gpu_peaks()
        self.run.sampled_memory(memory_limit())
        self._warn_if_near()
        self.view.resources_sampled(self.run)

    def read_peak(self, state: RankState) -> None:
        """The peak resident memory the rank wrote at its cell's end (``ranks._devicememory.cell_ended``),
        if above what the samples saw: every rank's figure, however short the cell."""
        if not self.enabled:
            return
        with contextlib.suppress(OSError, ValueError, TypeError):
            with open(state.files.memory_peak, encoding="utf-8") as fh:
                hwm = int(json.load(fh)["hwm"])
            state.peak_rss = max(state.peak_rss or 0, hwm)

    def read_gpu(self, state: RankState, force: bool = False) -> None:
        """The rank's GPU record, if it wrote a new one (``force``: read it whatever its time says)."""
        if not self.enabled:
            return
        path = state.files.device_memory
        try:
            modified = os.stat(path).st_mtime
        except OSError:
            return
        if not force and self.gpu_read.get(state.rank) == modified:
            return
        held = read_held(path)
        if held is None:
            return
        self.gpu_read[state.rank] = modified
        state.gpu = tuple(self._with_run_peaks(state.gpu, device) for device in held)

    def _with_run_peaks(self, before: tuple[DeviceHeld, ...], device: DeviceHeld) -> DeviceHeld:
        """``device``'s figures now, its peaks this run's: torch's own for a fresh run's rank (they count
        what fell between two samples), else the most seen in this run's samples."""
        if self.torch_peaks_are_the_runs:
            return device
        earlier = next((d for d in before if d.key == device.key), None)
        return dataclasses.replace(
            device,
            peak_allocated=max(device.allocated, earlier.peak_allocated if earlier else 0),
            peak_reserved=max(device.reserved, earlier.peak_reserved if earlier else 0),
        )

    def _running_gpus(self) -> dict[int, tuple[DeviceHeld, ...]]:
        return {s.rank: s.gpu for s in self.run.ranks if s.gpu and s.status in ("starting", "running")}

    def _note_gpu_peaks(self) -> None:
        """Each GPU's most held by the ranks together, in one sample: what the run needed of it (their
        peaks' sum would count peaks that never met)."""
        for gpu in totals(self._running_gpus()):
            self.run.gpu_held(gpu)

    def out_of_gpu_memory(self, state: RankState, message: str | None) -> str | None:
        """A rank's CUDA out-of-memory error, told with what each rank held on that GPU then (their
        records read now: the failed rank wrote its last one as it raised).  A node's rank: its agent's words."""
        if not self.enabled:
            return self.told.get(state.rank)
        for other in self.run.ranks:
            self.read_gpu(other, force=True)
        self._note_gpu_peaks()
        return out_of_memory_words(state.rank, message, {s.rank: s.gpu for s in self.run.ranks if s.gpu})

    def _warn_if_near(self) -> None:
        if self.run.memory_warning:
            return
        self._warn_if_gpu_near()
        limit = self.run.memory
        if self.run.memory_warning or limit is None or limit.used < WARN_AT * limit.total:
            return
        biggest = max(self.run.ranks, key=lambda s: s.rss or 0)
        self.run.warn_memory(
            f"memory is running out: {gigabytes(limit.used)} of {_whose(limit)} {gigabytes(limit.total)} in use, "
            f"rank {biggest.rank} holds the most ({gigabytes(biggest.rss or 0)}); the next rank to grow may be killed"
        )

    def _warn_if_gpu_near(self) -> None:
        running = self._running_gpus()
        for gpu in totals(running):
            if gpu.total and gpu.reserved >= WARN_AT * gpu.total:
                biggest = max(gpu.ranks, key=lambda r: sum(d.reserved for d in running[r] if d.key == gpu.key))
                held = sum(d.reserved for d in running[biggest] if d.key == gpu.key)
                self.run.warn_memory(
                    f"{gpu.gpu} is nearly full: the ranks' torch reserved {gigabytes(gpu.reserved)} of its {gigabytes(gpu.total)}, "
                    f"rank {biggest} the most ({gigabytes(held)}); the next allocation there may fail"
                )
                return

    def relayed(self, state: RankState, costs: Mapping[str, Any]) -> None:
        """A node's rank's figures, as its agent sampled them (``cluster._wire.Costs``: its peaks
        already the run's)."""
        state.cpu_percent, state.rss = costs["cpu"], costs["rss"]
        state.peak_rss = max(state.peak_rss or 0, costs["peak_rss"] or 0) or None
        state.gpu = parse_held(costs["gpu"]) or state.gpu
        if costs.get("memory"):
            self.told[state.rank] = str(costs["memory"])
        if costs.get("warning"):
            self.run.warn_memory(f"{state.node or 'a node'}: {costs['warning']}")

    def relayed_all(self) -> None:
        """A batch of relayed figures is in: the GPUs' peaks noted, the view told."""
        self._note_gpu_peaks()
        self.view.resources_sampled(self.run)

    def killed_for_memory(self, state: RankState) -> str | None:
        """Why a rank that died by SIGKILL did, when it was the out-of-memory killer: "killed for memory
        at 5.1 GB; 12.5 GB of this machine's 12.7 GB was in use" (None: a plain SIGKILL, or not sampled
        here).  The machine's figure, not the ranks' sum: pages a forked rank still shares with the
        kernel count in both, so the ranks' figures can add up to more than there is."""
        if not self.enabled:
            return self.told.get(state.rank) if state.exit_code == -signal.SIGKILL else None
        if state.exit_code != -signal.SIGKILL:
            return None
        limit = self.run.memory
        near = limit is not None and limit.used >= NEAR_LIMIT * limit.total
        if oom_kills() <= self.oom_before and not near:
            return None
        said = f"killed for memory at {gigabytes(state.peak_rss or 0)}"
        if limit is not None:
            said += f"; {gigabytes(limit.used)} of {_whose(limit)} {gigabytes(limit.total)} was in use"
        return said


def _whose(limit: MemoryLimit) -> str:
    return "this container's" if limit.source == "container" else "this machine's"
