"""In a kept world's rank: what a name holds here, for ``%spawn show WORLD NAME`` (issue #43, item 4).

Each rank describes its own value: its type; a tensor's shape, dtype, device and bytes; a DTensor's
mesh (its shape, dimension names and which global ranks it holds), its placements, its global shape,
and this rank's local shard with where it starts in the global tensor (torch's own
``compute_local_shape_and_global_offset``, as ``visualize_sharding`` uses); a module's parameters
(count, bytes, devices, and the placements of its DTensor parameters: an FSDP2 model).  The kernel
lines the ranks up (``views._shards_html``).  Nothing here moves data between ranks: a DTensor is
described from its metadata and local shard only, so no collective runs and a busy peer cannot hang it.
"""

from __future__ import annotations

from typing import Any

FIELDS_MAX = 8  # a module's parameters described one by one, at most


def describe(namespace: dict[str, Any], expression: str) -> dict[str, Any]:
    """What ``expression`` (a name, or a dotted path: ``model.lin.weight``) holds in this rank."""
    head, *path = expression.split(".")
    if head not in namespace:
        return {"missing": f"no name {head!r} on this rank"}
    value = namespace[head]
    for i, part in enumerate(path):
        try:
            value = getattr(value, part)
        except AttributeError:
            return {"missing": f"{'.'.join([head, *path[:i]])} has no attribute {part!r}"}
    return describe_value(value)


def describe_value(value: Any) -> dict[str, Any]:
    kind = type(value)
    found: dict[str, Any] = {"type": f"{kind.__module__}.{kind.__qualname__}".removeprefix("builtins.")}
    try:
        import torch
    except ImportError:  # pragma: no cover - a rank always has torch
        return found
    dtensor = _dtensor(value)
    if dtensor is not None:
        found.update(dtensor)
    elif isinstance(value, torch.Tensor):
        found.update(_tensor(value))
    elif isinstance(value, torch.nn.Module):
        found.update(_module(value))
    else:
        text = repr(value)
        found["repr"] = text if len(text) <= 200 else text[:197] + "..."
    return found


def _tensor(tensor: Any) -> dict[str, Any]:
    return {
        "shape": list(tensor.shape),
        "dtype": str(tensor.dtype).removeprefix("torch."),
        "device": str(tensor.device),
        "bytes": int(tensor.numel() * tensor.element_size()),
        "requires_grad": bool(tensor.requires_grad),
    }


def _dtensor(value: Any) -> dict[str, Any] | None:
    try:
        from torch.distributed.tensor import DTensor
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    except ImportError:
        return None
    if not isinstance(value, DTensor):
        return None
    mesh = value.device_mesh
    local = value.to_local()
    found = {
        "dtensor": True,
        "shape": list(value.shape),
        "dtype": str(value.dtype).removeprefix("torch."),
        "device": str(local.device),
        "mesh_shape": list(mesh.shape),
        "mesh_dims": list(mesh.mesh_dim_names or ()),
        "mesh_ranks": mesh.mesh.flatten().tolist(),
        "placements": [repr(p) for p in value.placements],  # Shard(dim=0), Replicate()
        "local_shape": list(local.shape),
        "bytes": int(local.numel() * local.element_size()),
        "requires_grad": bool(value.requires_grad),
    }
    try:
        shape, offset = compute_local_shape_and_global_offset(value.shape, mesh, value.placements)
        found["local_shape"], found["offset"] = list(shape), list(offset)
    except Exception as err:  # a placement this torch cannot place (a custom one): its shard shown without where
        found["offset_error"] = f"{type(err).__name__}: {err}"
    return found


def _local(tensor: Any) -> Any:
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


def _module(module: Any) -> dict[str, Any]:
    params = list(module.named_parameters())
    devices = sorted({str(p.device) for _, p in params})
    described = []
    for name, param in params[:FIELDS_MAX]:
        one = _dtensor(param) or _tensor(param)
        one["name"] = name
        described.append(one)
    held = [_local(p) for _, p in params]  # an FSDP2 model's parameters are DTensors: this rank holds its shards
    return {
        "parameters": sum(int(p.numel()) for _, p in params),
        "tensors": len(params),
        "bytes": sum(int(t.numel() * t.element_size()) for t in held),
        "devices": devices,
        "params": described,
    }
