"""A GPU stood in for torch in a rank, on a machine with none (issue #44's figures, tested on CPU).

The cell tells the rank's thread (``ranks._devicememory``) that CUDA is initialized and hands it a
stand-in for ``torch.cuda`` whose calls it makes (``device_count``, ``memory_stats_as_nested_dict``,
``holds_context``, ``device``, ``get_device_properties``) report the counters a caching allocator would; ``_held(allocated, reserved)``
sets them.  ``torch.cuda`` itself is left as it is: the rest of nbspawn in the rank (which asks
``torch.cuda.is_initialized`` before it synchronizes a GPU) sees no GPU.  Everything after the
thread's reads is nbspawn's real path.  tests/gpu/test_cuda.py runs the same figures on a real GPU.
"""

from __future__ import annotations

GB = 10**9
TOTAL = 3_400_000_000  # the stand-in GPU's memory: the ranks' 3 GB is 88 % of it, past the warning's 85 %

STAND_IN = f"""\
import contextlib, os, time, types, torch
import nbspawn.ranks._devicememory as _devicememory
rank = int(os.environ["RANK"])
now = {{"allocated": 0, "reserved": 0, "peak_allocated": 0, "peak_reserved": 0}}
def _held(n, reserved):  # what a caching allocator's counters would say after allocating n bytes
    now.update(allocated=n, reserved=reserved)
    now["peak_allocated"] = max(now["peak_allocated"], n)
    now["peak_reserved"] = max(now["peak_reserved"], reserved)
_gpu = types.SimpleNamespace(  # what the thread asks of torch.cuda, once CUDA is initialized
    device_count=lambda: 1,
    memory_stats_as_nested_dict=lambda device=None: {{
        "allocated_bytes": {{"all": {{"current": now["allocated"], "peak": now["peak_allocated"]}}}},
        "reserved_bytes": {{"all": {{"current": now["reserved"], "peak": now["peak_reserved"]}}}},
    }},
    holds_context=lambda index: True,  # this process holds a context on the stand-in GPU
    device=lambda index: contextlib.nullcontext(),  # the thread makes a device its own before it asks
    get_device_properties=lambda device=None: types.SimpleNamespace(name="Stand-in GPU", total_memory={TOTAL}, uuid="GPU-5ta11d-1n"),
)
_devicememory.initialized_cuda = lambda: _gpu  # "CUDA is initialized, and this is its torch.cuda"
"""
