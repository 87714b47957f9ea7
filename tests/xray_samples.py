"""Collectives X-rays for the tests of its views (tests/unit/test_unit_xray_html.py, tests/browser/test_xray_view.py):
real gloo records, and runs no test machine can make (16 ranks x 10,000 collectives, NCCL's sends and
receives) built through the ranks' own record (``ranks._xray.CollectiveLog``) from flight-recorder
entries as torch dumps them.

``records("story")`` / ``records("hang")``: what tests/xray_ranks.py wrote with torch 2.13 on 4 gloo ranks
(tests/unit/xray_records/, described in tests/unit/test_unit_xray.py).
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

from nbspawn.events._xray import XRay, analyse
from nbspawn.ranks._xray import CollectiveLog

RECORDS = Path(__file__).parent / "unit" / "xray_records"
LONG_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")


def records(name: str) -> dict[int, dict[str, Any]]:
    return {int(path.stem): json.loads(path.read_text()) for path in sorted((RECORDS / name).glob("*.json"))}


def sample(name: str) -> XRay:
    return analyse(records(name))


def entry(record_id: int, op: str, created_ns: int, seq: int = 0, p2p: bool = False, sizes=((1024, 256),)) -> dict[str, Any]:
    """One flight-recorder entry as NCCL's recorder dumps it."""
    return {
        "record_id": record_id,
        "process_group": ("0", "default_pg"),
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "op_id": record_id + 1,
        "profiling_name": "nccl:" + op,
        "time_created_ns": created_ns,
        "input_sizes": [list(shape) for shape in sizes],
        "input_dtypes": ["BFloat16"],
        "is_p2p": p2p,
    }


def long_run(ranks: int = 16, count: int = 10_000, slow: int = 5, odd: int = 9, absent: int = 7) -> XRay:
    """``ranks`` ranks, ``count`` collectives 10 ms apart: rank ``slow`` 9 ms late at two in three (the
    straggler), rank ``odd`` calling another op 3 from the end (a mismatch), rank ``absent`` never
    entering the last (a hang)."""
    logs = {}
    for rank in range(ranks):
        log = logs[rank] = CollectiveLog(rank=rank)
        entries = []
        for seq in range(1, count + (0 if rank == absent else 1)):
            op = LONG_OPS[seq % len(LONG_OPS)]
            if rank == odd and seq == count - 3:
                op = "broadcast" if op == "all_gather" else "all_gather"
            late = 9_000_000 if rank == slow and seq % 3 else 0
            entries.append(entry(seq - 1, op, 1_000_000_000 + seq * 10_000_000 + rank * 20_000 + late, seq))
        for start in range(0, len(entries), 1000):  # as the drainer reads the ring: a part at a time
            log.add_entries(entries[start : start + 1000])
    return analyse({rank: log.as_json() for rank, log in logs.items()})


def pipeline_run() -> XRay:
    """4 NCCL ranks: three all_reduces, a pipeline's activations sent 0 -> 1 -> 2 -> 3, three more."""
    logs = {rank: CollectiveLog(rank=rank) for rank in range(4)}
    made = dict.fromkeys(logs, 0)

    def add(rank: int, op: str, created_ns: int, seq: int = 0, p2p: bool = False) -> None:
        logs[rank].add_entries([entry(made[rank], op, created_ns, seq, p2p, sizes=((8, 16),))])
        made[rank] += 1

    t = 1_000_000_000
    seq = 0
    for _ in range(3):
        seq += 1
        for rank in range(4):
            add(rank, "all_reduce", t + rank * 300_000, seq)
        t += 3_000_000
    for rank in range(3):
        add(rank, f"send {rank}->{rank + 1}", t + rank * 2_000_000, p2p=True)
        add(rank + 1, f"recv {rank + 1}<-{rank}", t + rank * 2_000_000 + 400_000, p2p=True)
    t += 8_000_000
    for _ in range(3):
        seq += 1
        for rank in range(4):
            add(rank, "all_reduce", t + (3 - rank) * 200_000, seq)
        t += 3_000_000
    return analyse({rank: log.as_json() for rank, log in logs.items()})


def nccl_dump(rank: int, count: int, created0: int) -> bytes:
    """What ``torch._C._distributed_c10d._dump_nccl_trace(includeCollectives=True, ...)`` returns on
    an NCCL build after ``count`` all_reduces of the default group: torch's own schema (the keys of
    ``FlightRecorder::dump``: version, comm_lib_version, pg_config, pg_status, entries; an entry's
    record_id numbered from 0 in this recorder, ``state`` completed with the times torch discovered
    it started and completed, the duration CUDA events timed)."""
    import pickle

    entries = [
        {
            "record_id": i,
            "pg_id": 0,
            "process_group": ("0", "default_pg"),
            "collective_seq_id": i + 1,
            "p2p_seq_id": 0,
            "op_id": i + 1,
            "profiling_name": "nccl:all_reduce",
            "time_created_ns": created0 + 1_000_000 * i + 50_000 * rank,
            "duration_ms": 0.02,
            "input_sizes": [[1024]],
            "input_dtypes": ["Float"],
            "output_sizes": [[1024]],
            "output_dtypes": ["Float"],
            "state": "completed",
            "time_discovered_started_ns": created0 + 1_000_000 * i + 60_000,
            "time_discovered_completed_ns": created0 + 1_000_000 * i + 90_000,
            "retired": True,
            "timeout_ms": 600_000,
            "is_p2p": False,
            "thread_id": "140000000000000",
            "thread_name": "python",
        }
        for i in range(count)
    ]
    status = {"last_enqueued_collective": count, "last_started_collective": count, "last_completed_collective": count}
    return pickle.dumps(
        {
            "version": "2.10",
            "comm_lib_version": "2.27.5",
            "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
            "pg_status": {"0": status},
            "entries": entries,
        }
    )


# A rank's cell that stands in for an NCCL build with a GPU, on CPU: torch's ``_dump_nccl_trace`` answers
# what NCCL's recorder holds after 20 all_reduces of a 2-rank default group (``nccl_dump``, this rank's
# times), and the X-ray drainer's CUDA (``ranks._devicememory.initialized_cuda``) says CUDA is initialized
# with a context on device 0.  Everything after those two reads is nbspawn's real path: the drainer, the
# record, the kernel's analysis and the views.  tests/gpu/test_cuda.py runs NCCL for real.
NCCL_STAND_IN = (
    "import contextlib, os, pickle, types, torch\n"
    "import nbspawn.ranks._devicememory as _devicememory\n" + inspect.getsource(nccl_dump) + "_rank = int(os.environ['RANK'])\n"
    "torch._C._distributed_c10d._dump_nccl_trace = lambda includeCollectives=True, includeStackTraces=True, onlyActive=False: "
    "nccl_dump(_rank, 20, 10**18)\n"
    "_devicememory.initialized_cuda = lambda: types.SimpleNamespace(\n"
    "    device_count=lambda: 1, holds_context=lambda index: True, device=lambda index: contextlib.nullcontext())\n"
)
