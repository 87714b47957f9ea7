"""TPU ranks through a real kernel, on a faked 4-chip v4-8 host (issue 31).

No TPU here: the kernel is given a v4-8's topology variables (``TPU_SKIP_MDS_QUERY=1``, as torch_xla
reads them off a TPU VM's metadata server) and torch_xla's one chip-counting function answers 4.  The
ranks nbspawn starts get torch_xla's launcher environment; each then switches to ``PJRT_DEVICE=CPU``
before its XLA runtime starts, computes on its own XLA device, and the ranks sum over gloo (XLA's own
collectives across CPU processes are no-ops: each process is a world of one).  Skipped without
torch_xla (CI's ``make runtime-tpu-cpu`` job has it, pinned: this touches torch_xla internals).
"""

from __future__ import annotations

import json

import pytest
from kernel_harness import load_nbspawn, ok, rank_lines, run, start_kernel, stop_kernel

from nbspawn import _tpu

pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(not _tpu.installed(), reason="torch_xla is not installed (make runtime-tpu-cpu runs these)"),
]

V4_8 = {
    "TPU_SKIP_MDS_QUERY": "1",
    "TPU_ACCELERATOR_TYPE": "v4-8",
    "TPU_HOST_BOUNDS": "1,1,1",
    "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1",
    "TPU_WORKER_ID": "0",
}
FAKE_CHIPS = "from torch_xla._internal import tpu\ntpu.num_available_chips = lambda: 4  # no TPU here: a v4-8's 4 chips"

RANK_CELL = """
import os
os.environ["PJRT_DEVICE"] = "CPU"  # before this rank's XLA runtime starts: no TPU here
import torch, torch_xla
import torch.distributed as dist
t = torch.full((2,), float(int(os.environ["RANK"]) + 1), device=torch_xla.device())
mine = (t * 2).sum().cpu()  # computed on this rank's own XLA device
total = mine.clone()
dist.all_reduce(total)  # across ranks: gloo (XLA's collectives do not cross CPU processes)
keys = ["PJRT_LOCAL_PROCESS_RANK", "PJRT_LOCAL_PROCESS_COUNT", "TPU_VISIBLE_CHIPS", "TPU_PROCESS_BOUNDS",
        "TPU_CHIPS_PER_PROCESS_BOUNDS", "TPU_PROCESS_ADDRESSES", "TPU_PROCESS_PORT", "CLOUD_TPU_TASK_ID"]
seen = {"env": {k: os.environ.get(k) for k in keys}, "device": str(t.device), "mine": float(mine), "total": float(total)}
print("total", float(total))
"""


@pytest.fixture(scope="module")
def tpu_kernel():
    kernel = load_nbspawn(start_kernel(env=V4_8))
    ok(kernel, FAKE_CHIPS, timeout=180)
    yield kernel
    stop_kernel(kernel)


def seen_by_ranks(kernel) -> list[dict]:
    """The ranks' ``--out seen``, as bound in the kernel."""
    return json.loads(ok(kernel, "import json\nprint(json.dumps(seen))").stdout)


def expected_env(rank: int, n: int = 4) -> dict[str, str]:
    """What torch_xla's configure_topology gives local rank ``rank`` of a v4-8 (tests/unit/test_unit_tpu.py
    checks these against torch_xla's functions themselves)."""
    return {
        "PJRT_LOCAL_PROCESS_RANK": str(rank),
        "PJRT_LOCAL_PROCESS_COUNT": str(n),
        "TPU_VISIBLE_CHIPS": str(rank),
        "TPU_PROCESS_BOUNDS": "2,2,1",
        "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1",
        "TPU_PROCESS_ADDRESSES": ",".join(f"localhost:{8476 + r}" for r in range(n)),
        "TPU_PROCESS_PORT": str(8476 + rank),
        "CLOUD_TPU_TASK_ID": str(rank),
    }


def test_four_ranks_one_per_chip_compute_on_their_xla_devices_and_sum_over_gloo(tpu_kernel):
    # a leftover of an earlier one-process XLA launch in the kernel: torch_xla's setdefault would let it win
    ok(tpu_kernel, "import os\nos.environ['TPU_PROCESS_BOUNDS'] = '1,1,1'")
    result = ok(tpu_kernel, f"%%spawn --accelerator tpu --backend gloo --out seen\n{RANK_CELL}", timeout=300)
    for rank in range(4):
        assert rank_lines(result.stdout, rank) == ["total 40.0"], result.stdout  # 2 * 2 * (1 + 2 + 3 + 4)
    assert "the kernel's TPU_PROCESS_BOUNDS=1,1,1" in result.stdout + result.stderr
    got = seen_by_ranks(tpu_kernel)
    assert [s["env"] for s in got] == [expected_env(r) for r in range(4)]
    assert [s["mine"] for s in got] == [4.0, 8.0, 12.0, 16.0]
    assert all(s["device"].startswith("xla:") for s in got)
    # nbspawn never wrote the ranks' variables into the kernel
    left = ok(tpu_kernel, "print(sorted(k for k in os.environ if k.startswith(('TPU_', 'PJRT_LOCAL', 'CLOUD_TPU'))))")
    assert left.stdout.strip() == str(sorted([*V4_8, "TPU_PROCESS_BOUNDS"]))
    ok(tpu_kernel, "del os.environ['TPU_PROCESS_BOUNDS']")


def test_auto_is_one_rank_per_chip_and_a_one_rank_launch_does_not_shrink_the_next(tpu_kernel):
    one = ok(tpu_kernel, f"%%spawn --accelerator tpu -n 1 --backend gloo --out seen\n{RANK_CELL}", timeout=300)
    assert rank_lines(one.stdout, 0) == ["total 4.0"]
    got = seen_by_ranks(tpu_kernel)
    assert got[0]["env"]["TPU_PROCESS_BOUNDS"] == "1,1,1" and got[0]["env"]["TPU_PROCESS_PORT"] is None
    again = ok(tpu_kernel, f"%%spawn --accelerator tpu --backend gloo --out seen\n{RANK_CELL}", timeout=300)
    assert [rank_lines(again.stdout, r) for r in range(4)] == [["total 40.0"]] * 4
    got = seen_by_ranks(tpu_kernel)
    assert [s["env"] for s in got] == [expected_env(r) for r in range(4)]


def test_a_kept_world_keeps_its_ranks_environment_and_xla_tensors_across_cells(tpu_kernel):
    first = "%%spawn --world tpu --accelerator tpu --backend gloo\n" + RANK_CELL.replace(
        'print("total"', 'kept = t\nprint("total"'
    )
    result = ok(tpu_kernel, first, timeout=300)
    assert [rank_lines(result.stdout, r) for r in range(4)] == [["total 40.0"]] * 4
    later = ok(
        tpu_kernel,
        "%%spawn --world tpu -n auto --out seen\n"
        "import os\nseen = {'env': {k: os.environ.get(k) for k in keys}, 'kept': float((kept * 3).sum().cpu())}",
        timeout=300,
    )
    assert later.status == "ok"
    got = seen_by_ranks(tpu_kernel)
    assert [s["env"] for s in got] == [expected_env(r) for r in range(4)]
    assert [s["kept"] for s in got] == [6.0, 12.0, 18.0, 24.0]  # each rank's own XLA tensor, still there
    ok(tpu_kernel, "%spawn stop tpu")


def test_a_program_gets_the_same_environment_and_none_of_the_kernels_leftovers(tpu_kernel):
    ok(tpu_kernel, "import os\nos.environ['TPU_PROCESS_PORT'] = '9999'")  # a leftover: a one-chip rank gets no port at all
    try:
        result = ok(
            tpu_kernel,
            "%spawn --accelerator tpu -- sh -c 'echo $RANK chip=$TPU_VISIBLE_CHIPS task=$CLOUD_TPU_TASK_ID port=$TPU_PROCESS_PORT'",
            timeout=300,
        )
        assert [rank_lines(result.stdout, r) for r in range(4)] == [[f"{r} chip={r} task={r} port={8476 + r}"] for r in range(4)]
        one = ok(tpu_kernel, "%spawn --accelerator tpu -n 1 -- sh -c 'echo chip=$TPU_VISIBLE_CHIPS port=$TPU_PROCESS_PORT'")
        assert rank_lines(one.stdout, 0) == ["chip=0 port="]
    finally:
        ok(tpu_kernel, "del os.environ['TPU_PROCESS_PORT']")


def test_three_ranks_on_four_chips_are_refused_before_any_starts(tpu_kernel):
    result = run(tpu_kernel, "%%spawn --accelerator tpu -n 3\nprint('started')")
    assert result.status == "error" and "started" not in result.stdout
    assert "UsageError: -n 3 on a TPU host: torch_xla runs one process per chip (4 here)" in result.stderr


def test_a_kernel_whose_xla_runtime_is_up_is_refused_naming_the_line(tpu_kernel):
    """Last in this module: the kernel's runtime stays up."""
    ok(tpu_kernel, "import torch, torch_xla\nx = torch.ones(2, device=torch_xla.device())\nprint(x.cpu())")
    result = run(tpu_kernel, "%%spawn --accelerator tpu\nprint('started')")
    assert result.status == "error" and "started" not in result.stdout
    assert "UsageError: the XLA runtime is already up in this kernel (first at Cell In[" in result.stderr, result.stderr
    assert "line 2: x = torch.ones(2, device=torch_xla.device())" in result.stderr
