"""CUDA paths, through a real kernel. Skipped cleanly where no GPU is visible (CI is CPU-only)."""

from __future__ import annotations

import pytest
import torch
from kernel_harness import execute, ok

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(torch.cuda.device_count() == 0, reason="no CUDA GPU visible"),
]


CUDA_TIMEOUT = 180  # a cell's limit: CUDA's first initialisation in a process is slow


def test_each_rank_defaults_to_its_local_gpu(kernel):
    n = min(2, torch.cuda.device_count())
    result = ok(
        kernel, f"%%spawn -n {n} --start-method fork\nimport torch\nprint(torch.cuda.current_device())", timeout=CUDA_TIMEOUT
    )
    for rank in range(n):
        assert f"[rank{rank}]: {rank}" in result.stdout


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
    code = (
        f"%%spawn -n 1 --start-method {method} --share g --out back\n"
        "import torch\ng.add_(5)\nprivate.add_(5)\ntorch.cuda.synchronize()\nback = g * 2\n"
    )
    ok(fresh_kernel, code, timeout=CUDA_TIMEOUT)
    result = ok(fresh_kernel, "print(g.tolist(), private.tolist(), back[0].device.type, back[0].tolist())", timeout=CUDA_TIMEOUT)
    assert result.stdout == "[5.0, 5.0, 5.0, 5.0] [1.0, 1.0, 1.0, 1.0] cpu [10.0, 10.0, 10.0, 10.0]\n"


def test_cuda_tensors_cannot_be_shared_with_forked_ranks(fresh_kernel):
    ok(fresh_kernel, "import torch\ng = torch.zeros(4, device='cuda')", timeout=CUDA_TIMEOUT)
    result = execute(fresh_kernel.client, "%%spawn -n 1 --start-method forkserver --share g\npass", timeout=120)
    assert result.status == "ok"
    result = execute(fresh_kernel.client, "%%spawn -n 1 --start-method fork --share g\npass", timeout=60)
    assert result.status == "error"
