"""CUDA and NCCL paths, through a real kernel on a real GPU machine (issue 16).

Skipped cleanly where no GPU is visible (CI is CPU-only); the tests that need two GPUs skip on one.
The decisions these tests exercise end to end are unit-tested with facts passed in, on CPU, in
tests/test_unit_cuda.py.  Run this file on a GPU machine: it takes a few minutes.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time

import psutil
import pytest
import torch
from kernel_harness import descendants, execute, ok, rank_lines

GPUS = torch.cuda.device_count()  # NVML: does not initialize CUDA in the test process

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(GPUS == 0, reason="no CUDA GPU visible (CPU-only CI): these tests need a GPU machine"),
]
two_gpus = pytest.mark.skipif(GPUS < 2, reason="needs two or more GPUs")

CUDA_TIMEOUT = 180  # a cell's limit: CUDA's first initialisation in a process is slow


def _gpu_pids() -> set[int]:
    """Processes that hold a CUDA context, as nvidia-smi sees them (empty where it is missing)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return {int(line) for line in out.split() if line.strip().isdigit()}


# -- one GPU --------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_nccl_auto_ranks_all_reduce_on_their_local_gpu_without_a_barrier_warning(fresh_kernel, method):
    """-n auto --backend nccl under each start method: one rank per GPU, the all_reduce is right,
    each rank's current device is cuda:LOCAL_RANK (set lazily, then by init_process_group), and
    barrier() does not warn "using GPU ... to perform barrier as devices used by this process are
    currently unknown" because the group was made with device_id (defect 3).  Under fork the kernel
    has not touched CUDA: nbspawn counted the GPUs through NVML and its fork probe."""
    code = (
        f"%%spawn -n auto --backend nccl --start-method {method}\n"
        "import os, warnings, torch, torch.distributed as dist\n"
        "t = torch.ones(1, device='cuda') * (dist.get_rank() + 1)\n"
        "dist.all_reduce(t)\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    dist.barrier()\n"
        "print(t.item(), torch.cuda.current_device() == int(os.environ['LOCAL_RANK']), "
        "os.environ['TORCH_NCCL_ASYNC_ERROR_HANDLING'], [str(w.message)[:60] for w in caught])\n"
    )
    result = ok(fresh_kernel, code, timeout=CUDA_TIMEOUT)
    total = float(GPUS * (GPUS + 1) // 2)
    for rank in range(GPUS):
        assert rank_lines(result.stdout, rank) == [f"{total} True 1 []"]
    assert "barrier" not in result.stderr


def test_a_kernel_that_ran_is_available_runs_cpu_and_cuda_cells(fresh_kernel):
    """The first line of most GPU notebooks, torch.cuda.is_available(), runs cuInit and registers
    torch's at-fork handler without marking CUDA initialized (defect 1): nbspawn must notice (its
    fork probe) and use forkserver with a note, and both a CPU cell and a CUDA cell then work."""
    ok(fresh_kernel, "import torch\ndevice = 'cuda' if torch.cuda.is_available() else 'cpu'\nprint(device)")
    cpu = ok(fresh_kernel, "%%spawn -n 2\nimport torch\nprint(torch.ones(3).sum().item())", timeout=CUDA_TIMEOUT)
    assert "uses --start-method forkserver" in cpu.stderr and "is_available()" in cpu.stderr
    assert rank_lines(cpu.stdout, 0) == ["3.0"] and rank_lines(cpu.stdout, 1) == ["3.0"]
    gpu = ok(fresh_kernel, "%%spawn -n 1\nimport torch\nprint(torch.ones(1, device=device).device)", timeout=CUDA_TIMEOUT)
    assert rank_lines(gpu.stdout, 0) == ["cuda:0"]
    refused = execute(fresh_kernel.client, "%%spawn -n 1 --start-method fork\npass", timeout=60)
    assert refused.status == "error" and "cannot fork" in refused.stderr + refused.error_text


def test_get_arch_list_poisons_fork_and_nbspawn_notices(fresh_kernel):
    """get_arch_list() poisons fork without cuInit (Module.cpp: _cuda_getArchFlags calls poison_fork):
    only a forked child can tell, which is what nbspawn's probe asks."""
    ok(fresh_kernel, "import torch\nprint(len(torch.cuda.get_arch_list()) > 0)")
    result = ok(fresh_kernel, "%%spawn -n 1\nimport torch\nprint(torch.ones(1, device='cuda').item())", timeout=CUDA_TIMEOUT)
    assert "uses --start-method forkserver" in result.stderr and rank_lines(result.stdout, 0) == ["1.0"]


def test_a_cpu_cell_on_a_gpu_box_leaves_cuda_uninitialized_in_every_rank(fresh_kernel):
    """A rank selects its device lazily (torch.cuda._lazy_call): a cell that never touches CUDA
    never initializes it, forked or spawned, with or without a gloo group; and the kernel is left
    fork-clean by nbspawn's own GPU count."""
    for method in ("fork", "spawn"):
        code = (
            f"%%spawn -n 2 --start-method {method} --backend gloo\n"
            "import torch, torch.distributed as dist\n"
            "t = torch.ones(2)\ndist.all_reduce(t)\n"
            "print(t.tolist(), torch.cuda.is_initialized())"
        )
        result = ok(fresh_kernel, code, timeout=CUDA_TIMEOUT)
        for rank in range(2):
            assert rank_lines(result.stdout, rank) == ["[2.0, 2.0] False"]
    kernel = ok(fresh_kernel, "import torch\nprint(torch.cuda.is_initialized())")
    assert kernel.stdout == "False\n"


def test_more_ranks_than_gpus_with_backend_auto_is_gloo_and_nccl_is_a_usage_error(fresh_kernel):
    """-n gpus+1 --backend auto: ranks past the GPUs would get "invalid device ordinal" under nccl,
    so auto picks gloo and says so (defect 2); --backend nccl is refused before anything starts."""
    n = GPUS + 1
    result = ok(
        fresh_kernel,
        f"%%spawn -n {n} --backend auto\nimport torch.distributed as dist\nprint(dist.get_backend())",
        timeout=CUDA_TIMEOUT,
    )
    assert "uses gloo" in result.stderr
    for rank in range(n):
        assert rank_lines(result.stdout, rank) == ["gloo"]
    refused = execute(fresh_kernel.client, f"%%spawn -n {n} --backend nccl\npass", timeout=60)
    assert refused.status == "error" and "one GPU per rank" in refused.stderr + refused.error_text


def test_a_kernel_module_used_without_share_arrives_as_leaf_parameters_on_each_ranks_gpu(fresh_kernel):
    """A kernel `Linear().cuda()` used by a cell without --share (defect 4): sent as CPU data and
    placed in place on the rank's own GPU under no_grad, so Parameters stay leaf Parameters (an
    optimizer takes them, backward fills .grad) and no rank opens a context on the kernel's GPU
    unless it is its own."""
    ok(fresh_kernel, "import torch\nm = torch.nn.Linear(4, 2).cuda()\nw0 = m.weight.detach().cpu().clone()")
    code = (
        "%%spawn -n auto\n"
        "import os, torch\n"
        "local = int(os.environ['LOCAL_RANK'])\n"
        "opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "m(torch.ones(1, 4, device=m.weight.device)).sum().backward()\n"
        "opt.step()\n"
        "others = [i for i in range(torch.cuda.device_count()) if i != local and torch._C._cuda_hasPrimaryContext(i)]\n"
        "print(type(m.weight).__name__, m.weight.is_leaf, m.weight.grad is not None, "
        "m.weight.device.index == local, others, torch.equal(m.weight.detach().cpu() + 0.1, w0))"
    )
    result = ok(fresh_kernel, code, timeout=CUDA_TIMEOUT)
    for rank in range(GPUS):
        assert rank_lines(result.stdout, rank) == ["Parameter True True True [] True"]
    assert ok(fresh_kernel, "print(torch.equal(m.weight.detach().cpu(), w0))").stdout == "True\n"  # the kernel's is untouched


def test_share_then_del_returns_the_kernels_gpu_memory(fresh_kernel):
    """--share g under spawn, written by the rank with no torch.cuda.synchronize() of its own: the
    rank synchronizes and drops its CUDA IPC references before it exits, so the kernel sees the
    writes, and after `del g` its allocated memory returns to 0 (defect 6)."""
    ok(fresh_kernel, "import torch, gc\ng = torch.zeros(1 << 20, device='cuda')\nbase = torch.cuda.memory_allocated()")
    ok(fresh_kernel, "%%spawn -n 1 --start-method spawn --share g\ng.add_(1)", timeout=CUDA_TIMEOUT)
    assert ok(fresh_kernel, "print(g.sum().item())").stdout == f"{float(1 << 20)}\n"
    result = ok(fresh_kernel, "del g\ngc.collect()\ntorch.cuda.ipc_collect()\nprint(torch.cuda.memory_allocated())")
    assert result.stdout == "0\n"


def test_a_world_releases_its_share_after_each_cell(fresh_kernel):
    """A kept world's rank drops --share names after the cell (not only when the name is sent
    again), so `del g` in the kernel frees the memory while the world lives."""
    ok(fresh_kernel, "import torch, gc\ng = torch.zeros(1 << 20, device='cuda')")
    ok(fresh_kernel, "%%spawn --world keep -n 1 --start-method forkserver --share g\ng.add_(2)", timeout=CUDA_TIMEOUT)
    result = ok(
        fresh_kernel, "print(g[0].item())\ndel g\ngc.collect()\ntorch.cuda.ipc_collect()\nprint(torch.cuda.memory_allocated())"
    )
    assert result.stdout == "2.0\n0\n"
    ok(fresh_kernel, "%spawn stop keep")


def test_out_of_a_cuda_module_arrives_on_cpu_as_leaf_parameters(fresh_kernel):
    """A CUDA IPC handle dies with the rank: --out brings a CPU copy, Parameters kept."""
    ok(
        fresh_kernel,
        "%%spawn -n 1 --start-method spawn --out net\nimport torch\nnet = torch.nn.Linear(2, 2).cuda()",
        timeout=CUDA_TIMEOUT,
    )
    result = ok(fresh_kernel, "p = net[0].weight\nprint(type(p).__name__, p.device.type, p.is_leaf, p.requires_grad)")
    assert result.stdout == "Parameter cpu True True\n"


def test_an_nccl_world_over_twenty_cells_then_stop_is_fast_and_leaves_nothing(fresh_kernel):
    """A kept NCCL world stays in step over many cells (each rank settles its GPU before it
    answers), and `%spawn stop` tears it down (destroy_process_group) in under 5 s."""
    ok(fresh_kernel, "%%spawn --world g -n auto --backend nccl\nimport torch, torch.distributed as dist", timeout=CUDA_TIMEOUT)
    for cell in range(20):
        code = f"%%spawn --world g\nt = torch.ones(1, device='cuda') * {cell}\ndist.all_reduce(t)\nprint(t.item())"
        result = ok(fresh_kernel, code, timeout=CUDA_TIMEOUT)
        assert rank_lines(result.stdout, 0) == [f"{float(cell * GPUS)}"]
    pids = ok(fresh_kernel, "from nbspawn.executors._world import worlds\nprint(*worlds()['g'].pids)").stdout.split()
    began = time.monotonic()
    ok(fresh_kernel, "%spawn stop g")
    assert time.monotonic() - began < 5.0
    assert not [pid for pid in map(int, pids) if psutil.pid_exists(pid)]


def test_an_nccl_program(fresh_kernel, tmp_path):
    """A program sets up its own group, torchrun-style: LOCAL_RANK is its device."""
    script = tmp_path / "train.py"
    script.write_text(
        "import os, torch, torch.distributed as dist\n"
        "local = int(os.environ['LOCAL_RANK'])\n"
        "torch.cuda.set_device(local)\n"
        "dist.init_process_group('nccl', device_id=torch.device('cuda', local))\n"
        "t = torch.ones(1, device='cuda')\ndist.all_reduce(t)\nprint(t.item())\n"
        "dist.destroy_process_group()\n"
    )
    result = ok(fresh_kernel, f"%spawn -n auto -- {script}", timeout=CUDA_TIMEOUT)
    assert rank_lines(result.stdout, 0) == [f"{float(GPUS)}"]


def test_fork_after_cuda_init_is_refused_and_auto_picks_forkserver(fresh_kernel):
    ok(fresh_kernel, "import torch\nx = torch.ones(1, device='cuda')", timeout=CUDA_TIMEOUT)
    refused = execute(fresh_kernel.client, "%%spawn -n 1 --start-method fork\npass", timeout=60)
    assert refused.status == "error" and "CUDA is already initialized" in refused.stderr + refused.error_text
    chosen = ok(fresh_kernel, "%%spawn -n 1\nimport torch\nprint(torch.ones(1, device='cuda').item())", timeout=CUDA_TIMEOUT)
    assert "uses --start-method forkserver" in chosen.stderr and "[rank0]: 1.0" in chosen.stdout


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_cuda_tensors_are_shared_both_ways_through_cuda_ipc(fresh_kernel, method):
    ok(
        fresh_kernel,
        "import torch\ng = torch.zeros(4, device='cuda')\nprivate = torch.ones(4, device='cuda')",
        timeout=CUDA_TIMEOUT,
    )
    code = f"%%spawn -n 1 --start-method {method} --share g --out back\nimport torch\ng.add_(5)\nprivate.add_(5)\nback = g * 2\n"
    ok(fresh_kernel, code, timeout=CUDA_TIMEOUT)
    result = ok(fresh_kernel, "print(g.tolist(), private.tolist(), back[0].device.type, back[0].tolist())", timeout=CUDA_TIMEOUT)
    assert result.stdout == "[5.0, 5.0, 5.0, 5.0] [1.0, 1.0, 1.0, 1.0] cpu [10.0, 10.0, 10.0, 10.0]\n"


def test_cuda_tensors_cannot_be_shared_with_forked_ranks(fresh_kernel):
    ok(fresh_kernel, "import torch\ng = torch.zeros(4, device='cuda')", timeout=CUDA_TIMEOUT)
    result = execute(fresh_kernel.client, "%%spawn -n 1 --start-method forkserver --share g\npass", timeout=120)
    assert result.status == "ok"
    result = execute(fresh_kernel.client, "%%spawn -n 1 --start-method fork --share g\npass", timeout=60)
    assert result.status == "error"


def test_cuda_share_to_ranks_that_see_other_gpus_is_refused(fresh_kernel):
    """A CUDA IPC handle names the kernel's device number: ranks with another CUDA_VISIBLE_DEVICES
    would open it on another GPU (defect 9)."""
    ok(fresh_kernel, "import torch\ng = torch.zeros(4, device='cuda')", timeout=CUDA_TIMEOUT)
    result = execute(
        fresh_kernel.client,
        f"%%spawn -n 1 --start-method spawn --env CUDA_VISIBLE_DEVICES={GPUS - 1},0 --share g\npass",
        timeout=60,
    )
    assert result.status == "error" and "other GPUs than the kernel" in result.stderr + result.error_text


# -- two GPUs or more -----------------------------------------------------------------------------


@two_gpus
def test_a_rank_raising_while_another_waits_in_all_reduce_fails_within_the_grace_period(fresh_kernel):
    """Rank 1 raises; rank 0 waits in an all_reduce it can never complete.  The failing rank aborts
    its communicators and leaves with os._exit (defect 7); the supervisor stops rank 0 within the
    grace period; no rank is left holding a GPU."""
    code = (
        "%%spawn -n 2 --backend nccl --start-method spawn --grace-period 5\n"
        "import torch, torch.distributed as dist\n"
        "if dist.get_rank() == 1:\n    raise ValueError('boom')\n"
        "t = torch.ones(1, device='cuda')\ndist.all_reduce(t)\nprint(t.item())\n"
    )
    began = time.monotonic()
    result = execute(fresh_kernel.client, code, timeout=CUDA_TIMEOUT)
    took = time.monotonic() - began
    assert result.status == "error" and "boom" in result.stderr + result.error_text
    assert took < 60, took  # CUDA start-up included; never the NCCL timeout (10 min)
    time.sleep(1.0)
    left = {p.pid for p in descendants(fresh_kernel.pid)}
    assert not (left & _gpu_pids())


@two_gpus
def test_an_interrupted_world_with_unequal_collectives_is_correct_or_reported_lost_never_hung(fresh_kernel):
    """Rank 0 queues three all_reduces, rank 1 two, then both sleep; the kernel is interrupted.
    NCCL calls return once queued, so both ranks come back to Python: rank 1 settles (its two
    matched), rank 0's third never completes, so it cannot settle within the grace period and the
    world is reported lost (defect 5).  Either way the next cell is correct and nothing hangs."""
    ok(fresh_kernel, "%%spawn --world u -n 2 --backend nccl\nimport torch, time, torch.distributed as dist", timeout=CUDA_TIMEOUT)
    code = (
        "%%spawn --world u --grace-period 3\n"
        "t = torch.ones(1, device='cuda')\n"
        "for _ in range(3 if dist.get_rank() == 0 else 2):\n    dist.all_reduce(t)\n"
        "time.sleep(60)\n"
    )

    def interrupt() -> None:
        time.sleep(8.0)
        fresh_kernel.manager.interrupt_kernel()

    threading.Thread(target=interrupt, daemon=True).start()
    result = execute(fresh_kernel.client, code, timeout=120)
    assert result.status == "error"
    said = result.stderr + result.error_text
    again = "%%spawn --world u -n 2 --backend nccl\nimport torch, torch.distributed as dist\nt = torch.ones(1, device='cuda')\ndist.all_reduce(t)\nprint(t.item())"
    if "lost" in said:
        with contextlib.suppress(Exception):
            ok(fresh_kernel, "%spawn stop u")
    after = ok(fresh_kernel, again, timeout=CUDA_TIMEOUT)
    assert rank_lines(after.stdout, 0) == ["2.0"] and rank_lines(after.stdout, 1) == ["2.0"]
    ok(fresh_kernel, "%spawn stop u")


@two_gpus
def test_a_share_on_cuda0_written_by_two_ranks(fresh_kernel):
    """Both ranks open the kernel's cuda:0 tensor through CUDA IPC (rank 1's own device is cuda:1)."""
    ok(fresh_kernel, "import torch\ng = torch.zeros(2, device='cuda:0')", timeout=CUDA_TIMEOUT)
    ok(
        fresh_kernel,
        "%%spawn -n 2 --start-method spawn --share g\nimport os\ng[int(os.environ['RANK'])] = 1",
        timeout=CUDA_TIMEOUT,
    )
    assert ok(fresh_kernel, "print(g.tolist())").stdout == "[1.0, 1.0]\n"


@two_gpus
def test_cuda_visible_devices_in_env_counts_the_ranks_gpus(fresh_kernel):
    """--env CUDA_VISIBLE_DEVICES=0 -n auto: one rank, not one per GPU of the kernel (defect 9)."""
    result = ok(
        fresh_kernel,
        "%%spawn -n auto --env CUDA_VISIBLE_DEVICES=0\nimport torch\nprint(torch.cuda.device_count())",
        timeout=CUDA_TIMEOUT,
    )
    assert rank_lines(result.stdout, 0) == ["1"] and rank_lines(result.stdout, 1) == []


@two_gpus
def test_two_cluster_nodes_on_distinct_gpus_all_reduce_over_nccl_with_the_engines_cuda_untouched():
    """Two local "nodes", each engine bound to one GPU (as Slurm binds them): nccl between the
    nodes, a kernel CUDA tensor arrives in the ranks on their GPU, and the engines never
    initialize CUDA (defect 8)."""
    from cluster_nodes import LocalNodes
    from test_cluster import connected_kernel

    with LocalNodes(nodes=2, engines_per_node=1) as nodes:
        rc = nodes.client()
        for eid in sorted(nodes.engine_pids):
            rc[eid].apply_sync(lambda i: __import__("os").environ.__setitem__("CUDA_VISIBLE_DEVICES", str(i)), nodes.node_of[eid])
        with connected_kernel(nodes) as kernel:
            ok(kernel, "import torch\nbase = torch.arange(3.0, device='cuda')", timeout=CUDA_TIMEOUT)
            code = (
                "%%spawn --cluster rc -n 1 --backend auto\n"
                "import torch, torch.distributed as dist\n"
                "t = base.sum().reshape(1)\ndist.all_reduce(t)\n"
                "print(dist.get_backend(), t.item(), base.device)"
            )
            result = ok(kernel, code, timeout=CUDA_TIMEOUT)
            for rank in range(2):
                assert rank_lines(result.stdout, rank) == ["nccl 6.0 cuda:0"]
            untouched = rc[sorted(nodes.engine_pids)].apply_sync(
                lambda: __import__("sys").modules.get("torch") is None or not __import__("torch").cuda.is_initialized()
            )
            assert all(untouched)
