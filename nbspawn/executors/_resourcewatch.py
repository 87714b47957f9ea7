"""The supervisor's room for what the ranks cost (issue #44): sampled about once a second from the
kernel's side (``events._resources``), kept on each rank's state (CPU now, resident memory now and
its peak), the machine's or container's memory beside them, one warning when the ranks near it, and a
rank killed for memory named as such rather than as a bare SIGKILL.

The ranks are made the out-of-memory killer's first choice (``oom_score_adj`` 500 above the
kernel's): when memory runs out, a rank goes, not the kernel with the notebook's state.
"""

from __future__ import annotations

import signal
import time
from typing import TYPE_CHECKING

from ..events._resources import MemoryLimit, gigabytes, memory_limit, oom_kills, raise_oom_score, read_processes, tree_totals

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
        self.enabled = enabled  # a cluster's ranks are other machines' processes: their agents' to sample
        self.sampled_at = 0.0
        self.cpu_before: dict[int, tuple[float, float]] = {}  # rank -> (CPU seconds, when)
        self.oom_before = 0

    def ranks_started(self) -> None:
        if not self.enabled:
            return
        self.oom_before = oom_kills()
        for state in self.run.ranks:
            if state.pid and state.status != "absent":
                raise_oom_score(state.pid)
        self.sample(force=True)

    def sample(self, force: bool = False) -> None:
        """The ranks' figures now, if a second has gone by since the last (or ``force``)."""
        now = time.monotonic()
        if not self.enabled or (not force and now - self.sampled_at < SAMPLE_EVERY):
            return
        self.sampled_at = now
        running = {s.rank: s.pid for s in self.run.ranks if s.pid and s.status in ("starting", "running")}
        if not running:
            return
        totals = tree_totals(read_processes(), running)
        for rank, (cpu, rss) in totals.items():
            state = self.run.ranks[rank]
            before = self.cpu_before.get(rank)
            if before is not None and now > before[1]:
                state.cpu_percent = round(max(0.0, 100 * (cpu - before[0]) / (now - before[1])), 1)
            self.cpu_before[rank] = (cpu, now)
            state.rss = rss
            state.peak_rss = max(state.peak_rss or 0, rss)
        self.run.memory = memory_limit()
        self._warn_if_near()
        self.view.resources_sampled(self.run)

    def _warn_if_near(self) -> None:
        limit = self.run.memory
        if limit is None or self.run.memory_warning or limit.used < WARN_AT * limit.total:
            return
        biggest = max(self.run.ranks, key=lambda s: s.rss or 0)
        self.run.memory_warning = (
            f"memory is running out: {gigabytes(limit.used)} of {_whose(limit)} {gigabytes(limit.total)} in use, "
            f"rank {biggest.rank} holds the most ({gigabytes(biggest.rss or 0)}); the next rank to grow may be killed"
        )

    def killed_for_memory(self, state: RankState) -> str | None:
        """Why a rank that died by SIGKILL did, when it was the out-of-memory killer: "killed for memory
        at 5.1 GB; 12.5 GB of this machine's 12.7 GB was in use" (None: a plain SIGKILL, or not sampled
        here).  The machine's figure, not the ranks' sum: pages a forked rank still shares with the
        kernel count in both, so the ranks' figures can add up to more than there is."""
        if not self.enabled or state.exit_code != -signal.SIGKILL:
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
