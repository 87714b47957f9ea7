"""What a collective is called: torch.distributed's function, from what torch's flight recorders name it.

One table, read by the hang verdicts (``events._where``: a rank's stack is in the function, its recorder
names the op) and the X-ray (``events._xray``: a call made by the cell, and the collectives the backend
ran under it).
"""

from __future__ import annotations

# What torch's flight recorders call a collective (its profiling name less the backend) where that is not
# the torch.distributed function that issued it: the function a verdict names, then the other functions
# whose frame (a stack's innermost in distributed_c10d.py) issues it too.  ProcessGroupNCCL records
# barrier() as an all_reduce of one element and keeps the C++ names of the tensor forms; gloo records
# all_gather_into_tensor as all_gather; torch 2.13's all_gather_into_tensor and reduce_scatter_tensor
# call their new names (all_gather_single, reduce_scatter_single).
_CALLED = {
    "all_reduce_barrier": ("barrier",),
    "_all_gather_base": ("all_gather_into_tensor", "all_gather_single"),
    "_reduce_scatter_base": ("reduce_scatter_tensor", "reduce_scatter_single"),
    "_broadcast_oop": ("broadcast",),
    "_reduce_oop": ("reduce",),
    "all_gather": ("all_gather", "all_gather_into_tensor", "all_gather_single"),
    "reduce_scatter": ("reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single"),
    "all_to_all": ("all_to_all", "all_to_all_single"),
}
P2P = ("send", "recv")  # NCCL records them with their peer: "send 0->1", "recv 1<-0"


def called(recorded: str) -> str:
    """The torch.distributed function a flight-recorder op stands for: ``all_reduce_barrier`` ->
    ``barrier``, ``_all_gather_base`` -> ``all_gather_into_tensor``, ``send 0->1`` -> ``send``."""
    base = recorded.split(" ", 1)[0]
    return _CALLED.get(base, (base,))[0]


def same_call(op: str, recorded: str) -> bool:
    """Whether a rank whose stack is in torch.distributed's ``op`` is in the collective recorded as ``recorded``."""
    base = recorded.split(" ", 1)[0]
    return op in _CALLED.get(base, (base,))
