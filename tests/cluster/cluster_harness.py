"""What the cluster tests share: a kernel connected to test nodes, and what is left on the nodes."""

from __future__ import annotations

import contextlib
import os
import time

import psutil
from kernel_harness import loaded_kernel, ok, settle_kernels, shm_entries, stop_kernel


@contextlib.contextmanager
def connected_kernel(nodes):
    """A kernel with nbspawn loaded and ``rc``, a client of ``nodes``; stopped however the test ends."""
    kernel = loaded_kernel()
    settle_kernels()  # no kernel starting beside a cluster's engines, agents and ranks on 2 cores
    try:
        ok(
            kernel,
            f"import ipyparallel as ipp\nrc = ipp.Client({nodes.url_file!r})\nrc.wait_for_engines({len(nodes.engine_pids)}, timeout=60)",
        )
        yield kernel
    finally:
        stop_kernel(kernel)


def ranks_on_every_node(nodes, count: int = 2) -> dict[int, int]:
    """For wait_for_ranks: ``count`` ranks under each node's (single) engine."""
    return {nodes.engines_of(n)[0]: count for n in range(nodes.nodes)}


def rank_processes(nodes) -> dict[int, list[psutil.Process]]:
    """Each engine's children that are not its nanny: the ranks (or their leftovers) it started."""
    found = {}
    for engine, pid in nodes.engine_pids.items():
        try:
            kids = psutil.Process(pid).children(recursive=True)
        except psutil.NoSuchProcess:
            continue
        found[engine] = [k for k in kids if is_running(k) and "nanny" not in _cmdline(k)]
    return found


def process_or_none(pid: int | None) -> psutil.Process | None:
    try:
        return psutil.Process(pid) if pid else None
    except psutil.NoSuchProcess:
        return None


def _cmdline(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except psutil.Error:
        return ""


def is_running(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_for_ranks(nodes, per_engine: dict[int, int], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = rank_processes(nodes)
        if all(len(found.get(e, [])) >= n for e, n in per_engine.items()):
            return
        time.sleep(0.05)
    raise AssertionError(f"ranks did not start: {rank_processes(nodes)}")


def assert_nothing_left(nodes, timeout: float = 15) -> None:
    """No rank, zombie or process a rank started remains under any engine; no /dev/shm file of theirs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = {e: kids for e, kids in rank_processes(nodes).items() if kids}
        if not left:
            break
        time.sleep(0.1)
    assert not left, f"left running on the nodes: {left}"
    for pid in nodes.engine_pids.values():
        assert not shm_entries(f"nbspawn.{pid}."), shm_entries(f"nbspawn.{pid}.")
    for directory in getattr(nodes, "shm_dirs", []):  # each network-namespace node's own /dev/shm
        left_files = [name for name in os.listdir(directory) if name.startswith("nbspawn.")]
        assert not left_files, (directory, left_files)


def engines_idle(nodes, timeout: float = 20) -> None:
    """Every engine answers a new task: none is still busy with a run."""
    rc = nodes.client()
    ids = sorted(nodes.engine_pids)
    assert rc[ids].apply_async(os.getpid).get(timeout=timeout) == [nodes.engine_pids[i] for i in ids]
