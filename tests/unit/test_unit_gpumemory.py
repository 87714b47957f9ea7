"""The pure parts of the GPU figures (issue #44): a rank's record read and summed per physical GPU,
the words a CUDA out-of-memory error gets, and which GPU a rank's device is.  The rank's thread and
the kernel's reading of its file run for real in tests/kernel/test_gpu_memory_view.py (a stood-in
GPU) and tests/gpu/test_cuda.py (a real one)."""

from __future__ import annotations

import contextlib
import json
from types import SimpleNamespace

import pytest
import torch

from nbspawn.events._gpumemory import (
    DeviceHeld,
    gpu_names,
    is_cuda_out_of_memory,
    out_of_memory_words,
    parse_held,
    read_held,
    totals,
)
from nbspawn.ranks import _devicememory
from nbspawn.ranks._devicememory import physical_name, sample

GB = 10**9
# torch 2.13's message (c10/cuda/CUDACachingAllocator.cpp), as a T4 rank on Colab would see it
TORCH_OOM = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity of 14.74 GiB of which 1.12 GiB is free. "
    "Including non-PyTorch memory, this process has 13.61 GiB memory in use."
)


def held(index: int = 0, gpu: str = "GPU 0", uuid: str = "GPU-a", reserved: int = GB, peak: int | None = None) -> DeviceHeld:
    return DeviceHeld(index, gpu, uuid, "Tesla T4", 15 * GB, reserved, reserved, reserved, peak or reserved)


def test_a_record_is_read_and_malformed_devices_are_left_out(tmp_path):
    path = tmp_path / "device_memory.json"
    good = {"index": 0, "gpu": "GPU 2", "uuid": "GPU-x", "name": "T4", "total": 15, "allocated": 3, "reserved": 4}
    path.write_text(json.dumps({"devices": [good, {"index": "zero"}, "junk", {"gpu": "GPU 1"}]}))
    [device] = read_held(str(path))
    assert (device.gpu, device.allocated, device.reserved, device.peak_allocated, device.peak_reserved) == ("GPU 2", 3, 4, 3, 4)
    assert read_held(str(tmp_path / "none.json")) is None
    (tmp_path / "half.json").write_text('{"devices": [')
    assert read_held(str(tmp_path / "half.json")) is None
    assert parse_held([]) == ()


def test_totals_are_per_physical_gpu_whatever_each_rank_calls_it():
    # ranks 0 and 1 share GPU 0; rank 2's cuda:0 is GPU 1 (another UUID)
    ranks = {
        0: (held(reserved=GB),),
        1: (held(reserved=2 * GB, peak=3 * GB),),
        2: (held(gpu="GPU 1", uuid="GPU-b", reserved=GB),),
    }
    now = totals(ranks)
    assert [(g.gpu, g.reserved, g.ranks) for g in now] == [("GPU 0", 3 * GB, (0, 1)), ("GPU 1", GB, (2,))]
    assert [g.total for g in now] == [15 * GB, 15 * GB]
    assert gpu_names((held(), held(gpu="GPU 1", uuid="GPU-b"))) == "GPU 0, GPU 1"
    assert gpu_names(()) is None


def test_a_cuda_out_of_memory_is_told_with_what_each_rank_held_on_that_gpu():
    ranks = {
        0: (held(index=1, gpu="GPU 1", uuid="GPU-b", reserved=GB),),
        # rank 3 uses two GPUs: torch's message names its cuda:1, GPU 1
        3: (
            held(index=0, gpu="GPU 0", uuid="GPU-a", reserved=5 * GB),
            held(index=1, gpu="GPU 1", uuid="GPU-b", reserved=12 * GB),
        ),
    }
    assert out_of_memory_words(3, TORCH_OOM, ranks) == (
        "rank 3 ran out of memory on GPU 1 (Tesla T4, 15.0 GB): rank 0 held 1.0 GB, rank 3 12.0 GB (reserved by torch; 13.0 GB in all)"
    )
    # a message that names no device: the GPU where the rank holds the most
    assert out_of_memory_words(3, "CUDA out of memory.", ranks).startswith("rank 3 ran out of memory on GPU 1 ")
    assert (
        out_of_memory_words(0, TORCH_OOM, {0: (held(),)})
        == "rank 0 ran out of memory on GPU 0 (Tesla T4, 15.0 GB): rank 0 held 1.0 GB (reserved by torch)"
    )
    assert out_of_memory_words(2, TORCH_OOM, ranks) is None  # not sampled: nothing made up


@pytest.mark.parametrize(
    ("exc_type", "message", "cuda"),
    [
        ("OutOfMemoryError", TORCH_OOM, True),
        ("torch.OutOfMemoryError", TORCH_OOM, True),
        ("MemoryError", "out of memory", False),  # the host's
        ("OutOfMemoryError", "my own class, another message", False),
        (None, TORCH_OOM, False),
    ],
)
def test_which_errors_are_cudas_out_of_memory(exc_type, message, cuda):
    assert is_cuda_out_of_memory(exc_type, message) is cuda


@pytest.mark.parametrize(
    ("index", "visible", "name"),
    [(0, None, "GPU 0"), (1, "2,3", "GPU 3"), (0, " 5 ", "GPU 5"), (1, "GPU-1a2b,GPU-3c4d", "cuda:1"), (2, "0,1", "cuda:2")],
)
def test_a_ranks_device_is_named_by_the_physical_gpu_where_cuda_visible_devices_says_it(index, visible, name):
    assert physical_name(index, visible) == name


@pytest.fixture(autouse=True)
def _no_properties_asked_yet():
    """Each test's devices are asked afresh (the rank's thread asks a device's properties once)."""
    _devicememory._properties_of.clear()
    yield
    _devicememory._properties_of.clear()


def test_the_ranks_sample_lists_only_the_devices_its_torch_reserved_memory_on():
    """The rank's side, over a stand-in for ``torch.cuda`` (no GPU here): a device never used is not
    asked its properties (asking could make a CUDA context on it)."""
    asked: list[tuple[int, int]] = []  # (the device asked about, the thread's device then)
    current = [0]  # the asking thread's device: 0 until it sets one, as a new thread's is

    @contextlib.contextmanager
    def device(index: int):
        before, current[0] = current[0], index
        yield
        current[0] = before

    stats = {
        0: {},
        1: {"allocated_bytes": {"all": {"current": 3, "peak": 7}}, "reserved_bytes": {"all": {"current": 4, "peak": 8}}},
    }

    def properties(index: int) -> SimpleNamespace:
        asked.append((index, current[0]))
        return SimpleNamespace(name="H200", total_memory=141, uuid="GPU-h")

    cuda = SimpleNamespace(
        device_count=lambda: 2,
        memory_stats_as_nested_dict=stats.__getitem__,
        get_device_properties=properties,
        device=device,
        holds_context=lambda index: True,
    )
    assert sample(cuda, "4,6") == [
        {
            "index": 1,
            "gpu": "GPU 6",
            "uuid": "GPU-h",
            "name": "H200",
            "total": 141,
            "allocated": 3,
            "reserved": 4,
            "peak_allocated": 7,
            "peak_reserved": 8,
        }
    ]
    assert asked == [(1, 1)]  # asked with the thread's device made the one asked about, never from GPU 0
    sample(cuda, "4,6")
    assert asked == [(1, 1)]  # properties are asked once


def test_a_device_the_rank_holds_no_context_on_is_never_asked(monkeypatch):
    """Memory counted on a device without a context of this process (the driver says so): not listed,
    and nothing asked of it that could open a context there."""
    stats = {0: {"allocated_bytes": {"all": {"current": 1, "peak": 1}}, "reserved_bytes": {"all": {"current": 2, "peak": 2}}}}

    def properties(index: int) -> SimpleNamespace:
        raise AssertionError(f"device {index} was asked its properties")

    cuda = SimpleNamespace(
        device_count=lambda: 1,
        memory_stats_as_nested_dict=stats.__getitem__,
        get_device_properties=properties,
        device=lambda index: contextlib.nullcontext(),
        holds_context=lambda index: False,
    )
    assert sample(cuda, None) == []


def test_the_driver_is_asked_whether_the_process_holds_a_context_where_torch_can_ask(monkeypatch):
    """``_TorchCuda.holds_context``: torch's ``_cuda_hasPrimaryContext`` where this torch has it (a CUDA
    build), else memory reserved there is taken to say so (a CPU build has no context to ask about)."""
    asked: list[int] = []
    monkeypatch.setattr(torch._C, "_cuda_hasPrimaryContext", lambda index: asked.append(index) or index == 1, raising=False)
    cuda = _devicememory._TorchCuda(torch)
    assert (cuda.holds_context(0), cuda.holds_context(1), asked) == (False, True, [0, 1])
    assert cuda.device_count is torch.cuda.device_count  # the rest is torch.cuda's own
    monkeypatch.delattr(torch._C, "_cuda_hasPrimaryContext")
    assert cuda.holds_context(0)
