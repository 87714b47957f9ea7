"""Names between the kernel and its ranks: what the cell uses, ``--share``, and ``--out``.

A forked rank simply has the kernel's namespace (copy-on-write).  A spawned one gets only the names
its cell uses, pickled *by value* with cloudpickle, because functions and classes defined in a
notebook live in ``__main__``, which a fresh interpreter cannot import (pytorch#20375).  Tensors
never travel as pickled bytes: ``--share`` objects are moved into shared memory in place and mapped
by every rank (their writes reach the kernel); other kernel tensors are mapped copy-on-write (see
``_shm``).  ``--out`` brings each rank's values back, tensors through /dev/shm files the kernel maps.
Anything that cannot travel is named, with its type, before a single process starts.
"""

from __future__ import annotations

import ast
import builtins
import io
import os
import sys
import types
from collections import ChainMap
from collections.abc import Callable, Collection, Mapping
from typing import Any, NamedTuple

import cloudpickle
import torch

from .. import _cuda
from .._rankdir import OUT, write_whole
from ..errors import SpawnUsageError
from . import _shm
from ._flow import (
    names_bound,  # noqa: F401 - what a world's cell makes its own, imported from here by its users
    names_needed,
)

# What IPython puts in every namespace; shipping these would drag the shell along.
_IPYTHON_NAMES = frozenset({"In", "Out", "get_ipython", "exit", "quit", "open", "_", "__", "___"})


def _shippable(name: str, value: Any, hidden: Mapping[str, Any]) -> bool:
    if name in _IPYTHON_NAMES or name.startswith("__") or name in vars(builtins):
        return False
    if name in hidden and hidden[name] is value:  # IPython's own _i1, _oh... unless the user rebound it
        return False
    return not isinstance(value, types.ModuleType) or value.__name__ != "builtins"


class _WithoutData(cloudpickle.Pickler):
    """Checks that everything but tensor data pickles by value (what goes to other machines), without
    copying the data."""

    def __init__(self, file: io.BytesIO) -> None:
        placeholder = {torch.UntypedStorage: _no_data, torch.storage.TypedStorage: _no_data}
        self.dispatch_table = ChainMap(placeholder, cloudpickle.Pickler._dispatch_table, cloudpickle.Pickler.dispatch_table)
        super().__init__(file)


def _no_data(_storage: Any) -> tuple:
    return (bytes, ())


def _by_value_check(value: Any) -> None:
    _WithoutData(io.BytesIO()).dump(value)


def _unpicklable(values: dict[str, Any], check: Callable[[Any], None] = _by_value_check) -> tuple[str, str, Exception] | None:
    """The first value that cannot travel (tensor data aside): its name, its type, and why."""
    for name, value in values.items():
        try:
            check(value)
        except Exception as err:
            return name, f"{type(value).__module__}.{type(value).__qualname__}", err
    return None


def first_unsendable(values: Mapping[str, Any]) -> tuple[str, str, Exception] | None:
    """The first of ``values`` that cannot reach a spawned rank (tensor data aside): its name, its type,
    and why; None when all can."""
    return _unpicklable(dict(values), _shm.check_travels)


def _refuse(bad: tuple[str, str, Exception], sent: Collection[str], where: str, instead: str) -> SpawnUsageError:
    """A name that cannot travel, said with the kernel names the cell is sent (so a name the user did
    not expect to be sent shows), and what to do instead: the hint fits the cell."""
    name, kind, err = bad
    return SpawnUsageError(
        f"cannot send {name!r} (a {kind}) to {where}: {err}. The kernel names this cell is sent (those it reads "
        f"before binding them): {', '.join(sorted(sent))}. {instead}"
    )


_IN_A_WORLD_CELL = (
    "Bind {name!r} in a cell on the world: a name a world cell binds is the world's own and is never sent again. "
    "Nothing was sent: the world is as it was."
)


def _wanted(
    tree: ast.Module, user_ns: Mapping[str, Any], hidden: Mapping[str, Any], owned: Collection[str] = ()
) -> dict[str, Any]:
    """The kernel names the cell needs (reads before binding them) that can and should travel; none a
    kept world ``owned`` (bound by a cell of its own)."""
    needed = names_needed(tree).difference(owned)
    return {name: user_ns[name] for name in sorted(needed) if name in user_ns and _shippable(name, user_ns[name], hidden)}


def pack_namespace(
    tree: ast.Module, user_ns: dict[str, Any], hidden: Mapping[str, Any] | None = None, shared: dict[str, Any] | None = None,
    *, world: str | None = None, owned: Collection[str] = (),
) -> _shm.Payload:  # fmt: skip
    """The kernel names a spawned cell needs (and the ``--share`` ones), ready to travel; on the kept
    world ``world``, none it ``owned``.  A name that cannot travel is refused here, before any rank
    runs or is sent anything, with what it is and what the cell is sent."""
    shared = shared or {}
    wanted = {**_wanted(tree, user_ns, hidden or {}, owned), **shared}
    bad = _unpicklable(wanted, _shm.check_travels)
    if bad is not None:
        if world is None:
            raise _refuse(
                bad, wanted, "spawned ranks", f"Bind {bad[0]!r} in the cell before reading it, or use --start-method fork."
            )
        raise _refuse(bad, wanted, f"world {world!r}", _IN_A_WORLD_CELL.format(name=bad[0]))
    _refuse_host_staging(wanted, shared)
    return _shm.Payload(wanted, shared=list(shared.values()))


HOST_SHARE = 0.5  # of the RAM available now: what CUDA tensors not shared may take on their way to the ranks


def _refuse_host_staging(wanted: Mapping[str, Any], shared: Mapping[str, Any]) -> None:
    """A CUDA tensor the cell reads without ``--share`` is copied whole to host RAM for the ranks: a
    7 GB model on Colab (12.7 GB of RAM) gets the kernel OOM-killed.  Refused above a share of the RAM
    available, before any rank starts, with the way out."""
    staged = _shm.staged_through_host({n: v for n, v in wanted.items() if n not in shared}, list(shared.values()))
    total = sum(staged.values())
    if not total:
        return
    import psutil

    available = psutil.virtual_memory().available
    if total <= available * HOST_SHARE:
        return
    names = sorted(staged, key=lambda name: -staged[name])
    them = "it" if len(names) == 1 else "them"
    raise SpawnUsageError(
        f"{', '.join(repr(n) for n in names)} {'holds' if len(names) == 1 else 'hold'} {total / 1e9:.1f} GB of CUDA "
        f"tensors, which the ranks would get through a copy in host RAM ({available / 1e9:.1f} GB available): "
        f"pass {them} with --share {' '.join(names)} (the ranks use the kernel's GPU memory), or make {them} in the cell."
    )


def pickle_names(
    tree: ast.Module, user_ns: dict[str, Any], hidden: Mapping[str, Any] | None = None,
    *, world: str | None = None, owned: Collection[str] = (),
) -> bytes:  # fmt: skip
    """The kernel names a cell needs, pickled once by value (tensors with their data), for other
    machines: what a cluster run sends, the same bytes, to every node; on the cluster world ``world``,
    none it ``owned``."""
    wanted = _wanted(tree, user_ns, hidden or {}, owned)
    bad = _unpicklable(wanted)
    if bad is not None:
        if world is None:
            raise _refuse(bad, wanted, "other nodes", f"Bind {bad[0]!r} in the cell before reading it.")
        raise _refuse(bad, wanted, f"world {world!r}", _IN_A_WORLD_CELL.format(name=bad[0]))
    return _shm.dumps_by_value(wanted)  # CUDA tensors as CPU data: the engines never touch CUDA


def unpack_namespace(payload: Any) -> dict[str, Any]:
    """In a rank, once it is set up: the kernel's names, CUDA tensors among them on this rank's GPU."""
    names = _shm.Payload.unwrap(payload)
    _shm.place_arrivals()
    return names


# -- --share and --out ----------------------------------------------------------------------------


def _tensor_leaves(obj: Any) -> list[torch.Tensor] | None:
    """The tensors of a tensor, module or (nested) dict/list/tuple of tensors; None if it is not one."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, torch.nn.Module):
        return [*obj.parameters(), *obj.buffers()]
    if isinstance(obj, (dict, list, tuple)):
        leaves: list[torch.Tensor] = []
        for value in obj.values() if isinstance(obj, dict) else obj:
            found = _tensor_leaves(value)
            if found is None:
                return None
            leaves.extend(found)
        return leaves
    return None


def pick_shared(
    names: tuple[str, ...], user_ns: dict[str, Any], start_method: str, *, ranks_started: bool = False,
    ranks_visible: str | bool | None = False,
) -> dict[str, Any]:  # fmt: skip
    """The ``--share`` objects, validated; ``_shm.share_`` then moves their storages in place.

    ``ranks_started``: the ranks exist already (a kept world, started before this kernel could
    poison fork), so CUDA IPC reaches them whatever their start method.  ``ranks_visible``: the
    ranks' ``CUDA_VISIBLE_DEVICES`` (False: not known here; checked later by ``build_spec``).
    """
    _cuda.collect_ipc()  # what ranks of earlier runs released, freed before this run shares more
    shared: dict[str, Any] = {}
    for name in names:
        if name not in user_ns:
            raise SpawnUsageError(f"--share: {name!r} is not defined in the kernel")
        obj = user_ns[name]
        leaves = _tensor_leaves(obj)
        if leaves is None:
            raise SpawnUsageError(
                f"--share: {name!r} is a {type(obj).__module__}.{type(obj).__qualname__}; --share takes a tensor, "
                "an nn.Module, or a dict/list/tuple of tensors (other values reach the ranks anyway, as copies)"
            )
        reasons = {t: _why_not_shared(t, start_method, ranks_started) for t in leaves}  # each tensor asked once
        why = set(reasons.values()) - {None}
        if "cuda under fork" in why:
            raise SpawnUsageError(
                f"--share: {name!r} holds CUDA tensors, which forked ranks cannot use; "
                "use --start-method spawn or forkserver (CUDA IPC)"
            )
        if "not dense" in why:
            bad = next(t for t, reason in reasons.items() if reason == "not dense")
            raise SpawnUsageError(f"--share: {name!r} holds a {bad.layout} tensor; only dense tensors can be shared")
        if "pinned" in why:
            raise SpawnUsageError(
                f"--share: {name!r} holds pinned (page-locked) CPU memory: sharing moves a tensor into shared memory "
                "in place, which would unpin it. Leave it out of --share (the ranks get a copy, and it stays pinned), "
                "or share an unpinned tensor."
            )
        if "mapped" in why:
            raise SpawnUsageError(
                f"--share: {name!r} is mapped from a file (torch.load(mmap=True), UntypedStorage.from_file), which torch "
                f"{torch.__version__} cannot move into shared memory in place (torch >= 2.12 can). Share a copy "
                f"({name} = {name}.clone()), or leave it out of --share (the ranks get a copy)."
            )
        shared[name] = obj
    if ranks_visible is not False:
        check_shared_devices(list(shared.values()), ranks_visible if isinstance(ranks_visible, str) else None)
    return shared


def _why_not_shared(t: torch.Tensor, start_method: str, ranks_started: bool) -> str | None:
    """Why ``t`` cannot be shared with the ranks in place (None: it can): the one rule of ``--share``
    and of the tensors ``nbspawn.spawn`` shares from its ``args``."""
    if t.device.type == "cuda":
        return "cuda under fork" if start_method == "fork" and not ranks_started else None
    if t.device.type != "cpu":
        return "not cpu"  # meta, XLA...: the pickle's own reductions send them
    if t.layout != torch.strided or t.is_nested:
        return "not dense"
    if _shm.is_pinned(t.untyped_storage()):
        return "pinned"
    if not _shm.movable_in_place(t.untyped_storage()):
        return "mapped"
    return None


def shareable_tensors(obj: Any, start_method: str) -> list[torch.Tensor]:
    """The tensors pickling ``obj`` reaches that can be shared in place with ranks started by
    ``start_method`` (spawn or forkserver): CPU storages moved into shared memory, CUDA by IPC.
    ``torch.multiprocessing.spawn``'s pickler shares every tensor of its ``args`` so; those that
    cannot be (pinned, sparse, a file mapping torch < 2.12 cannot move) travel as copies."""
    return [t for t in _shm.tensors_reached(obj) if _why_not_shared(t, start_method, False) is None]


def check_shared_devices(shared: Collection[Any], ranks_visible: str | None) -> None:
    """CUDA IPC handles carry the kernel's device numbers: the ranks must number the GPUs alike."""
    kernel_visible = _cuda.kernel_visible()  # the numbering the kernel's CUDA has, not a value set since
    if _cuda.same_devices(kernel_visible, ranks_visible):
        return
    for obj in shared:
        if any(t.device.type == "cuda" for t in _tensor_leaves(obj) or []):
            raise SpawnUsageError(
                f"--share: CUDA tensors cannot be shared with ranks that see other GPUs than the kernel "
                f"(CUDA_VISIBLE_DEVICES={ranks_visible!r} in the ranks, {kernel_visible!r} in the kernel): "
                "a CUDA IPC handle names the kernel's device number. Leave CUDA_VISIBLE_DEVICES out of --env, "
                "or send the tensor without --share (each rank gets its own copy on its own GPU)."
            )


def returnable(value: Any, what: str) -> Any:
    """``value`` if it can come back to the kernel, else None, with one line on stderr saying why:
    what ``nbspawn.spawn`` does with a return value (torch's spawn discards them, so a value that
    cannot come back must not fail a rank whose work is done).  It cannot when pickling it fails (a
    lock, a DDP model after ``destroy_process_group``) or its tensors exceed the free space of
    /dev/shm, through which they travel (Docker's default is 64 MB)."""
    if value is None:
        return None
    kind = f"a {type(value).__module__}.{type(value).__qualname__}"
    try:
        tensors = _shm.tensors_reached(value)
    except Exception as err:
        why = f"{kind}, which cannot be pickled: {err}"
    else:
        storages = {t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in tensors if t.device.type != "meta"}
        nbytes = sum(storages.values())
        free = _shm.free_bytes()
        if nbytes <= free:
            return value
        why = f"{kind} holding {nbytes:,} bytes of tensors, and {_shm.SHM_DIR} has {free:,} bytes free"
    print(f"nbspawn: {what} cannot come back to the kernel ({why}): None instead", file=sys.stderr, flush=True)
    return None


def send_outputs(namespace: dict[str, Any], names: tuple[str, ...], prefix: str, rank_dir: str) -> None:
    """In a rank, after the cell: its values of ``--out`` names, tensors into /dev/shm under ``prefix``."""
    values = {name: namespace[name] for name in names if name in namespace}
    missing = [name for name in names if name not in namespace]
    try:
        data = _shm.dumps({"values": values, "missing": missing}, run_prefix=prefix)
    except Exception as err:
        name, kind, _why = _unpicklable(values) or ("?", "value", err)
        raise RuntimeError(f"--out: cannot send {name!r} (a {kind}) back to the kernel: {err}") from None
    path = os.path.join(rank_dir, OUT)
    write_whole(path, data)


class Outputs(NamedTuple):
    """``--out`` brought home: each name's values, indexed by rank, and the (rank, name) pairs that
    some rank did not define."""

    values: dict[str, list[Any]]
    missing: list[tuple[int, str]]


def receive_outputs(rank_dirs: list[str | None], names: tuple[str, ...]) -> Outputs:
    """In the kernel: every rank's values, by name, as lists indexed by rank; and what was missing
    (every name of a rank that left without sending any).  A rank whose directory is None did not run
    the cell (``--on``): its values are None, not missing."""
    outputs: dict[str, list[Any]] = {name: [] for name in names}
    missing: list[tuple[int, str]] = []
    for rank, rank_dir in enumerate(rank_dirs):
        if rank_dir is None:
            for name in names:
                outputs[name].append(None)
            continue
        path = os.path.join(rank_dir, OUT)
        try:
            with open(path, "rb") as fh:
                record = _shm.loads(fh.read())  # maps each tensor file and unlinks it
        except FileNotFoundError:  # it ended well before its cell did (sys.exit(0), os._exit(0)): it sent nothing
            record = {"values": {}}
        else:
            os.unlink(path)
        for name in names:
            if name in record["values"]:
                outputs[name].append(record["values"][name])
            else:
                outputs[name].append(None)
                missing.append((rank, name))
    return Outputs(outputs, missing)


def discard_outputs(rank_dirs: list[str]) -> None:
    """Remove the handles of a run whose values were not brought home (the data is swept separately)."""
    for rank_dir in rank_dirs:
        for name in (OUT, OUT + ".tmp"):
            try:
                os.unlink(os.path.join(rank_dir, name))
            except FileNotFoundError:
                pass
