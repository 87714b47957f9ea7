"""Micro-benchmark: moving CPU tensors into shared memory, and receiving them back from a rank.

    python bench/shm_micro.py                  # 1, 64, 256, 1024 MiB, 5 reps
    python bench/shm_micro.py --sizes 256 --reps 9

Every row of a repetition runs back to back and the order rotates between repetitions, so ratios
are computed per repetition (side by side) and their median is reported: on a noisy machine the
ratios are steadier than the absolute times.  Columns (milliseconds, median of the reps):

  memcpy      dst.copy_(src) into memory already touched: the bandwidth floor
  clone       src.clone(): a copy into fresh memory, page faults included (what "a copy" costs a user)
  share_mem_  Tensor.share_memory_() of a fresh copy
  share_      nbspawn.handoff._shm.share_() of a fresh copy
  reshare     share_() again, storage already shared (must not depend on the size)
  touch+      extra time of the first full read after share_ (mappings are populated lazily)
  import      kernel side of the way back: import_tensor of a file a rank exported
  export      rank side of the way back: export_tensor (a pwrite into /dev/shm)

The breakdown table splits share_memory_ into its parts: shm_open+ftruncate+fallocate (the kernel
allocates and zeroes every page), the copy into the fresh mapping (one page fault per 4 KiB page),
and freeing the old memory; and shows the alternatives that were measured.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import resource
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

try:
    from nbspawn.handoff import _shm
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from nbspawn.handoff import _shm

MiB = 1 << 20
MADV_POPULATE_WRITE = 23


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _fresh(src: torch.Tensor) -> torch.Tensor:
    return src.clone()


def _memfd_pwrite(src: torch.Tensor, threads: int = 1) -> int:
    n = src.untyped_storage().nbytes()
    fd = os.memfd_create("bench", os.MFD_CLOEXEC)
    os.ftruncate(fd, n)
    step = n // threads
    jobs = [
        threading.Thread(
            target=_shm._write_bytes, args=(fd, src.data_ptr() + i * step, step if i < threads - 1 else n - i * step, i * step)
        )
        for i in range(threads)
    ]
    for j in jobs:
        j.start()
    for j in jobs:
        j.join()
    return fd


def main_rows(src: torch.Tensor, prefix: str) -> dict[str, float]:
    """One repetition of the main table; returns seconds per column."""
    out: dict[str, float] = {}
    order = list(ROWS)
    rot = main_rows.calls % len(order)
    main_rows.calls += 1
    for name in order[rot:] + order[:rot]:
        gc.collect()
        out.update(ROWS[name](src, prefix))
    return out


main_rows.calls = 0


def _row_memcpy(src, prefix):
    dst = torch.empty_like(src)
    dst.copy_(src)
    t0 = time.perf_counter()
    dst.copy_(src)
    return {"memcpy": time.perf_counter() - t0}


def _row_clone(src, prefix):
    t0 = time.perf_counter()
    c = src.clone()
    dt = time.perf_counter() - t0
    del c
    return {"clone": dt}


def _row_share_memory(src, prefix):
    c = _fresh(src)
    f0 = _faults()
    t0 = time.perf_counter()
    c.share_memory_()
    dt = time.perf_counter() - t0
    faults = _faults() - f0
    t0 = time.perf_counter()
    c.share_memory_()
    re = time.perf_counter() - t0
    t0 = time.perf_counter()
    c.max()
    read = time.perf_counter() - t0
    return {"share_mem_": dt, "faults(share_mem_)": faults, "reshare(torch)": re, "_read_torch": read}


def _row_share(src, prefix):
    c = _fresh(src)
    f0 = _faults()
    t0 = time.perf_counter()
    _shm.share_(c)
    dt = time.perf_counter() - t0
    faults = _faults() - f0
    t0 = time.perf_counter()
    _shm.share_(c)
    re = time.perf_counter() - t0
    t0 = time.perf_counter()
    c.max()
    read = time.perf_counter() - t0
    t0 = time.perf_counter()
    c.max()
    read2 = time.perf_counter() - t0
    t0 = time.perf_counter()
    payload = _shm.dumps(c)
    dumps = time.perf_counter() - t0
    _shm.loads(payload)  # claim the descriptor ticket (same process: served by resource_sharer)
    return {
        "share_": dt,
        "faults(share_)": faults,
        "reshare": re,
        "touch+": max(read - read2, 0.0),
        "dumps(shared)": dumps,
        "payload_bytes": len(payload),
    }


def _row_out(src, prefix):
    t0 = time.perf_counter()
    handle = _shm.export_tensor(src, prefix)
    export = time.perf_counter() - t0
    t0 = time.perf_counter()
    back = _shm.import_tensor(handle)
    imp = time.perf_counter() - t0
    t0 = time.perf_counter()
    back.max()
    first = time.perf_counter() - t0
    assert back.data_ptr() != src.data_ptr()
    del back
    return {"export": export, "import": imp, "import+read": imp + first}


ROWS = {
    "memcpy": _row_memcpy,
    "clone": _row_clone,
    "share_memory_": _row_share_memory,
    "share_": _row_share,
    "out": _row_out,
}


def breakdown(src: torch.Tensor) -> dict[str, float]:
    n = src.untyped_storage().nbytes()
    flat = src.view(torch.uint8).view(-1)
    out: dict[str, float] = {}
    gc.collect()
    t0 = time.perf_counter()
    s = torch.UntypedStorage._new_shared(n)  # what share_memory_ allocates: fallocate'd shm
    out["torch shm alloc (fallocate, zeroes)"] = time.perf_counter() - t0
    f0 = _faults()
    t0 = time.perf_counter()
    torch.empty(0, dtype=torch.uint8).set_(s).copy_(flat)
    out["  copy_ into it (a fault per 4 KiB page)"] = time.perf_counter() - t0
    out["  [count] page faults in that copy"] = _faults() - f0
    t0 = time.perf_counter()
    torch.empty(0, dtype=torch.uint8).set_(s).copy_(flat)
    out["  same copy again (no faults)"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    del s
    out["  free the shm"] = time.perf_counter() - t0
    c = src.clone()
    t0 = time.perf_counter()
    del c
    out["free old anon memory"] = time.perf_counter() - t0
    gc.collect()
    t0 = time.perf_counter()
    fd = _memfd_pwrite(src)
    out["memfd + pwrite (share_'s copy)"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    s = torch.UntypedStorage._new_shared_fd_cpu(fd, n)
    out["  map it (_new_shared_fd_cpu)"] = time.perf_counter() - t0
    os.close(fd)
    libc = ctypes.CDLL(None, use_errno=True)
    t0 = time.perf_counter()
    libc.madvise(ctypes.c_void_p(s.data_ptr()), ctypes.c_size_t(n), MADV_POPULATE_WRITE)
    out["  MADV_POPULATE_WRITE after (not used)"] = time.perf_counter() - t0
    del s
    gc.collect()
    t0 = time.perf_counter()
    fd = _memfd_pwrite(src, threads=2)
    out["memfd + pwrite, 2 threads (inode lock)"] = time.perf_counter() - t0
    os.close(fd)
    gc.collect()
    fd = os.memfd_create("bench", os.MFD_CLOEXEC)
    os.ftruncate(fd, n)
    t0 = time.perf_counter()
    s = torch.UntypedStorage._new_shared_fd_cpu(fd, n)
    libc.madvise(ctypes.c_void_p(s.data_ptr()), ctypes.c_size_t(n), MADV_POPULATE_WRITE)
    torch.empty(0, dtype=torch.uint8).set_(s).copy_(flat)
    out["memfd + POPULATE_WRITE + copy_ (2 thr)"] = time.perf_counter() - t0
    os.close(fd)
    del s
    return out


def _ms(x: float) -> str:
    return f"{x * 1e3:9.2f}" if x < 10 else f"{x * 1e3:9.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 64, 256, 1024], help="MiB")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--no-breakdown", action="store_true")
    args = parser.parse_args()

    try:
        thp = Path("/sys/kernel/mm/transparent_hugepage/shmem_enabled").read_text().strip()
    except OSError:
        thp = "?"
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} cpus, "
        f"sharing strategy {torch.multiprocessing.get_sharing_strategy()}, shmem THP: {thp}"
    )
    prefix = _shm.new_run_prefix()
    results: dict[int, list[dict[str, float]]] = {}
    parts: dict[int, list[dict[str, float]]] = {}
    try:
        for mib in args.sizes:
            src = torch.randn(mib * MiB // 4)
            for _ in range(args.reps):
                results.setdefault(mib, []).append(main_rows(src, prefix))
                if not args.no_breakdown:
                    parts.setdefault(mib, []).append(breakdown(src))
            del src
    finally:
        _shm.sweep(prefix)

    cols = ["memcpy", "clone", "share_mem_", "share_", "reshare", "touch+", "import", "export"]
    print(f"\nmilliseconds, median of {args.reps}")
    print(f"{'size':>8} " + " ".join(f"{c:>9}" for c in cols))
    for mib, reps in results.items():
        print(f"{mib:>5}MiB " + " ".join(_ms(statistics.median(r[c] for r in reps)) for c in cols))

    ratios = [
        ("share_mem_/clone", "share_mem_", "clone"),
        ("share_/clone", "share_", "clone"),
        ("share_/share_mem_", "share_", "share_mem_"),
        ("share_/memcpy", "share_", "memcpy"),
        ("(share_+touch+)/clone", None, "clone"),
        ("import/memcpy", "import", "memcpy"),
        ("import+read/memcpy", "import+read", "memcpy"),
    ]
    print("\nratios, median of the per-repetition ratios")
    print(f"{'size':>8} " + " ".join(f"{r[0]:>21}" for r in ratios))
    for mib, reps in results.items():
        cells = []
        for _, num, den in ratios:
            if num is None:
                vals = [(r["share_"] + r["touch+"]) / r[den] for r in reps]
            else:
                vals = [r[num] / r[den] for r in reps]
            cells.append(f"{statistics.median(vals):21.3f}")
        print(f"{mib:>5}MiB " + " ".join(cells))

    print("\nother, median")
    other = ["faults(share_mem_)", "faults(share_)", "reshare(torch)", "dumps(shared)", "payload_bytes", "import+read"]
    print(f"{'size':>8} " + " ".join(f"{c:>18}" for c in other))
    for mib, reps in results.items():
        cells = []
        for c in other:
            v = statistics.median(r[c] for r in reps)
            cells.append(f"{v:18.0f}" if c.startswith(("faults", "payload")) else f"{v * 1e3:16.3f}ms")
        print(f"{mib:>5}MiB " + " ".join(cells))

    if parts:
        print("\nbreakdown, milliseconds ([count]: a count), median")
        names = list(next(iter(parts.values()))[0])
        print(f"{'':42}" + " ".join(f"{str(m) + 'MiB':>10}" for m in parts))
        for name in names:
            cells = []
            for reps in parts.values():
                v = statistics.median(r[name] for r in reps)
                cells.append(f"{v:10.0f}" if "[count]" in name else f"{v * 1e3:10.1f}")
            print(f"{name:42}" + " ".join(cells))


if __name__ == "__main__":
    main()
