"""What each rank costs, read from the kernel's side: its CPU and its memory (issue #44).

Everything here is read from ``/proc`` and the kernel's control group, never by asking the ranks: no
thread in a rank, no process per rank, no CUDA touched.  One pass over ``/proc/<pid>/stat`` gives
every process's parent and CPU time, and ``statm`` what each process of a rank holds of its own (its
anonymous resident memory: not the libraries every rank maps, nor the kernel's shared tensors); a
rank's figures are its own process's plus its descendants' (DataLoader workers, a ``Pool``,
inductor's compile workers are what it costs too).  A page a forked child still shares with its
parent counts in both, so a rank whose workers share its tensors reads a little high; that errs
towards naming the rank that grew.

The machine's memory is the tighter of ``/proc/meminfo`` and the kernel's control group (v2's
``memory.max``, v1's ``memory.limit_in_bytes``, the smallest of its ancestors'): a container's
limit is what its out-of-memory killer enforces.  How many processes the out-of-memory killer has
killed in the kernel's control group (``oom_kill``; ``/proc/vmstat``'s where none says) tells a rank
that died by SIGKILL while it rose was killed for memory.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
NO_LIMIT = 1 << 60  # a control group without a limit says 9223372036854771712 (v1) or "max" (v2)


@dataclass(frozen=True)
class ProcStat:
    """One process, as ``/proc/<pid>/stat`` has it."""

    pid: int
    ppid: int
    cpu_seconds: float  # user and system time so far
    rss_bytes: int


def parse_stat(text: str) -> ProcStat | None:
    """``/proc/<pid>/stat``'s line (its name may hold spaces and parentheses: the last ')' ends it)."""
    try:
        pid = int(text[: text.index(" ")])
        fields = text[text.rindex(")") + 2 :].split()
        # after the name: state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime ... rss (the 22nd)
        return ProcStat(pid, int(fields[1]), (int(fields[11]) + int(fields[12])) / CLOCK_TICKS, int(fields[21]) * PAGE_BYTES)
    except (ValueError, IndexError):
        return None


def read_processes(proc: str = "/proc", only: Iterable[int] | None = None) -> dict[int, ProcStat]:
    """Every process this kernel can see (~0.02 ms each), or only the pids in ``only``: one that ended
    while read is left out."""
    found: dict[int, ProcStat] = {}
    try:
        names = os.listdir(proc) if only is None else [str(pid) for pid in only]
    except OSError:
        return found
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"{proc}/{name}/stat", encoding="ascii", errors="replace") as fh:
                stat = parse_stat(fh.read())
        except OSError:
            continue
        if stat is not None:
            found[stat.pid] = stat
    return found


def private_bytes(pid: int, proc: str = "/proc") -> int | None:
    """The process's resident memory less its file-backed and shared pages (``/proc/<pid>/statm``'s
    resident less shared: its anonymous memory): what it holds of its own.  Plain RSS would count
    torch's libraries (~0.5 GB, shared by every rank and reclaimable) and the kernel's tensors a rank
    maps from shared memory in every rank again: four ranks would "hold" more than the machine has."""
    try:
        with open(f"{proc}/{pid}/statm", encoding="ascii") as fh:
            fields = fh.read().split()
        return max(0, int(fields[1]) - int(fields[2])) * PAGE_BYTES
    except (OSError, ValueError, IndexError):
        return None


def tree_totals(processes: Mapping[int, ProcStat], roots: Mapping[int, int], proc: str = "/proc") -> dict[int, tuple[float, int]]:
    """Each root's (CPU seconds, bytes it holds of its own: :func:`private_bytes`), its descendants'
    included: ``roots`` maps a rank to its pid; a rank whose process is gone is left out."""
    children: dict[int, list[int]] = {}
    for stat in processes.values():
        children.setdefault(stat.ppid, []).append(stat.pid)
    totals: dict[int, tuple[float, int]] = {}
    for rank, pid in roots.items():
        if pid not in processes:
            continue
        cpu, rss, todo, seen = 0.0, 0, [pid], set()
        while todo:
            current = todo.pop()
            if current in seen:
                continue
            seen.add(current)
            stat = processes[current]
            cpu += stat.cpu_seconds
            own = private_bytes(current, proc)
            rss += stat.rss_bytes if own is None else own
            todo.extend(c for c in children.get(current, ()) if c in processes)
        totals[rank] = (cpu, rss)
    return totals


@dataclass(frozen=True)
class CpuMark:
    """A rank's CPU seconds at one sample, and when: what its next sample's percentage counts from.
    ``alone``: the rank's own process only (the sample as ranks start: ``read_processes(only=...)``)."""

    cpu: float
    when: float
    alone: bool = False


def cpu_percent(before: CpuMark | None, tree_cpu: float, own_cpu: float, now: float) -> float | None:
    """A rank's CPU now, in percent of one core, from its mark ``before`` to ``now``: its process and
    descendants' seconds (``tree_cpu``), or its own process's (``own_cpu``) where the mark counted only
    that; a descendant's whole lifetime counted against one second would read thousands of percent
    (a kept world's rank with persistent DataLoader workers). None: nothing to count from."""
    if before is None or now <= before.when:
        return None
    spent = (own_cpu if before.alone else tree_cpu) - before.cpu
    return round(max(0.0, 100 * spent / (now - before.when)), 1)


@dataclass(frozen=True)
class MemoryLimit:
    """What the ranks may use together: ``total`` bytes, ``used`` now by everything under it, and
    whose figure it is ("machine" or "container")."""

    total: int
    used: int
    source: str


def meminfo(text: str) -> tuple[int, int]:
    """(MemTotal, MemAvailable) in bytes, from ``/proc/meminfo``."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            values[key] = int(parts[0]) * 1024
    total = values.get("MemTotal", 0)
    return total, values.get("MemAvailable", values.get("MemFree", 0))


def cgroup_dirs(proc_cgroup: str, root: str = "/sys/fs/cgroup") -> list[tuple[str, int]]:
    """The kernel's memory control group and its ancestors, nearest first, as (directory, version)."""
    found: list[tuple[str, int]] = []
    for line in proc_cgroup.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            base, version = root if os.path.exists(f"{root}/cgroup.controllers") else f"{root}/unified", 2
        elif "memory" in controllers.split(","):
            base, version = f"{root}/memory", 1
        else:
            continue
        parts = [p for p in path.split("/") if p]
        for depth in range(len(parts), -1, -1):
            found.append((os.path.join(base, *parts[:depth]), version))
    return found


def _read_int(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as fh:
            text = fh.read().strip()
    except OSError:
        return None
    if text == "max":
        return NO_LIMIT
    return int(text) if text.isdigit() else None


def cgroup_limit(dirs: Iterable[tuple[str, int]]) -> tuple[int, int] | None:
    """(limit, used) of the tightest control group holding the kernel, or None where none limits it."""
    best: tuple[int, int] | None = None
    for directory, version in dirs:
        limit = _read_int(f"{directory}/memory.max" if version == 2 else f"{directory}/memory.limit_in_bytes")
        if limit is None or limit >= NO_LIMIT:
            continue
        used = _read_int(f"{directory}/memory.current" if version == 2 else f"{directory}/memory.usage_in_bytes")
        if best is None or limit < best[0]:
            best = (limit, used or 0)
    return best


def memory_limit(proc: str = "/proc", cgroup_root: str = "/sys/fs/cgroup") -> MemoryLimit | None:
    """The machine's memory or, tighter, the kernel's container's; None where neither can be read."""
    try:
        with open(f"{proc}/meminfo", encoding="ascii") as fh:
            total, available = meminfo(fh.read())
    except OSError:
        return None
    limit = None
    try:
        with open(f"{proc}/self/cgroup", encoding="ascii") as fh:
            limit = cgroup_limit(cgroup_dirs(fh.read(), cgroup_root))
    except OSError:
        pass
    if limit is not None and limit[0] < total:
        return MemoryLimit(limit[0], limit[1], "container")
    return MemoryLimit(total, total - available, "machine") if total else None


def _counted(path: str, key: str) -> int | None:
    """``key N`` from a flat-keyed file (``memory.oom_control``, ``memory.events.local``, ``vmstat``)."""
    try:
        with open(path, encoding="ascii") as fh:
            for line in fh:
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
    except (OSError, ValueError):
        return None
    return None


def oom_kills(proc: str = "/proc", cgroup_root: str = "/sys/fs/cgroup") -> int:
    """Processes the out-of-memory killer has killed in the kernel's own memory control group (where
    its ranks are: a kill in another container, or in a group beside it, is not theirs), or, where no
    group says, on the whole machine since boot (``/proc/vmstat``)."""
    try:
        with open(f"{proc}/self/cgroup", encoding="ascii") as fh:
            dirs = cgroup_dirs(fh.read(), cgroup_root)
    except OSError:
        dirs = []
    for directory, version in dirs[:1]:
        # v1 counts a group's own kills; v2's memory.events counts its children's too, .local its own
        path = f"{directory}/memory.oom_control" if version == 1 else f"{directory}/memory.events.local"
        count = _counted(path, "oom_kill")
        if count is not None:
            return count
    return _counted(f"{proc}/vmstat", "oom_kill") or 0


def raise_oom_score(pid: int, above: int = 500, proc: str = "/proc") -> bool:
    """Make ``pid`` (a rank) the out-of-memory killer's choice before the kernel: its ``oom_score_adj``
    ``above`` the kernel's own (at most 1000).  Raising it needs no privilege; its children inherit it."""
    try:
        with open(f"{proc}/self/oom_score_adj", encoding="ascii") as fh:
            mine = int(fh.read().strip() or 0)
        with open(f"{proc}/{pid}/oom_score_adj", "w", encoding="ascii") as fh:
            fh.write(str(min(1000, mine + above)))
        return True
    except (OSError, ValueError):
        return False


def lower_cpu_priority(pid: int, by: int, proc: str = "/proc") -> bool:
    """Give ``pid`` (a rank) and each of its threads a nice value ``by`` above the kernel's own (at most
    19): when ranks outnumber the cores, the kernel that relays their output and answers Stop, the
    notebook's server and a browser on the same machine get a core first.  Linux keeps a nice value per
    thread, so every thread the rank has now is set; the threads and processes it starts later inherit
    it.  Raising one's own processes' nice value needs no privilege."""
    if by <= 0:
        return False
    target = min(19, os.getpriority(os.PRIO_PROCESS, 0) + by)
    try:
        threads = [int(tid) for tid in os.listdir(f"{proc}/{pid}/task")]
    except (OSError, ValueError):
        threads = [pid]
    done = False
    for tid in threads:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, target)
            done = True
        except OSError:  # a thread that ended meanwhile
            pass
    return done


def gigabytes(value: int) -> str:
    """``5.1 GB`` (decimal, as ``free -h``'s readers and Colab's RAM bar count), ``850 MB`` under one."""
    if value >= 10**9:
        return f"{value / 10**9:.1f} GB"
    return f"{value / 10**6:.0f} MB"
