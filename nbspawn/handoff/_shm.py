"""Passing tensors between the kernel and its ranks through shared memory, without copying them.

Three jobs, three pieces (Linux only: memfd, /dev/shm, fd passing):

``share_(obj)``
    Move the CPU storages under a tensor, module or container into shared memory *in place*, like
    ``Tensor.share_memory_()`` but faster, and free when a storage is already shared.  Same
    ``StorageImpl``, so the same Python tensor and every view of it follow; torch then sees the
    storage as shared (``is_shared()``), its multiprocessing reductions send a handle instead of the
    bytes, a forked rank inherits the mapping, and a rank's writes are seen by the kernel.

``dumps(obj)`` / ``loads(data)``
    cloudpickle (notebook functions and classes go by value) with torch's ForkingPickler reductions
    for tensors and storages, so a tensor travels as a file descriptor, not as its bytes.
    ``Payload(obj)`` does the same lazily, at the moment multiprocessing pickles a process's
    arguments, which is the leak-free way to hand one object to several spawn/forkserver ranks.

``dumps(obj, run_prefix=...)``, ``export_tensor`` / ``import_tensor``, ``sweep``
    The way back (``--out``): the rank exits before the kernel reads its result, so no process is
    left to pass a descriptor.  The rank writes each storage to a named file in /dev/shm under a
    per-run prefix; the kernel maps the file (nothing is copied, the cost does not depend on the
    size) and unlinks it at once; after the run, whatever a failed or killed rank left behind under
    the prefix is removed by ``sweep(run_prefix)``.

Why ``share_memory_`` is slow and what ``share_`` does instead (numbers: ``bench/shm_micro.py``).
Nothing in Linux turns private anonymous pages into shared ones, so moving a tensor into shared
memory means allocating new pages and copying; what matters is how.  ``share_memory_`` creates a
POSIX shm file, calls ``fallocate`` on it (the kernel allocates *and zeroes* every page), maps it, and
copies the data in from user space, taking one page fault per 4 KiB page (tmpfs gets no huge pages
unless ``/sys/kernel/mm/transparent_hugepage/shmem_enabled`` allows them, and the default is
``never``), then frees the old memory.  ``share_`` creates a memfd and writes the tensor's bytes into
it with ``pwrite``: the kernel allocates each page and copies into it directly, with no zeroing and no
user page faults.  The fresh mapping is populated lazily on first touch, which for pages already in
the page cache is cheap (read fault-around maps 16 pages at a time); ``MADV_POPULATE_WRITE`` would
cost more up front than it saves.  The new mapping then replaces the old data pointer inside the
existing ``StorageImpl`` with ``UntypedStorage._swap_data_ptr_``, the move ``share_memory_`` makes in
C++.  What remains is the kernel's cost of allocating 4 KiB shmem pages, about that of a fresh
copy (``clone``) and several times a copy into memory already touched; only huge pages for shmem
(an administrator's setting, picked up by the same code) would lower it.  Several writer threads do
not help: writes to one tmpfs file take its inode lock.  A memfd never has a name, so nothing can be
left in /dev/shm, and it is not limited by the size of the /dev/shm mount (64 MiB in a default
Docker container).

Rules worth knowing:

* fd passing (``dumps`` without ``run_prefix``, torch's default ``file_descriptor`` strategy) needs
  the sender alive until the receiver has unpickled.  Bytes from ``dumps`` carry a one-shot ticket
  per storage served by multiprocessing's ``resource_sharer`` thread; load each result exactly once,
  or the sender keeps a duplicate descriptor (and the memory) until it exits.  ``Payload`` avoids
  that: pickled while a process is being started, its descriptors go with the start itself
  (inherited by a spawn child, sent along with a forkserver request).
* Each shared CPU storage holds one open descriptor in every process that maps it (torch's
  ``file_descriptor`` strategy works that way too); thousands of small tensors can hit
  ``ulimit -n``.  Descriptors made here are close-on-exec.
* ``share_`` and ``share_memory_`` both swap memory under a storage: a thread writing to the tensor
  at the same moment can lose its write.
* CUDA tensors are not touched by ``share_``; torch sends them kernel→rank as CUDA IPC handles
  (spawn/forkserver only, the kernel must keep the tensor alive while ranks use it).  A CUDA IPC
  handle dies with the process that made it, so on the way back a rank's CUDA tensors are copied to
  CPU and arrive in the kernel as CPU tensors.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import itertools
import os
import re
import secrets
import stat
import sys
import threading
import types
import warnings
import weakref
from collections import ChainMap
from collections.abc import Collection, Iterator, Mapping
from multiprocessing.reduction import DupFd, ForkingPickler
from typing import Any, ClassVar, NamedTuple, cast

import cloudpickle
import torch
import torch.multiprocessing
from torch.multiprocessing import reductions as _torch_reductions

from .. import _cuda
from . import _ipc

__all__ = [
    "Payload",
    "TensorHandle",
    "dumps",
    "export_tensor",
    "import_tensor",
    "is_shared",
    "loads",
    "new_run_prefix",
    "share_",
    "sweep",
    "sweep_stale",
]

SHM_DIR = "/dev/shm"
_PREFIX_RE = re.compile(r"nbspawn\.(\d+)\.[0-9a-f]+\.\Z")
_NAME_RE = re.compile(r"nbspawn\.\d+\.[0-9a-f]+\.[0-9A-Za-z_.-]+\Z")
_CHUNK = 1 << 30  # Linux caps one write at 2 GiB - 4 KiB
_lock = threading.Lock()
_counter = itertools.count()


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # a fork taken while another thread was sharing must not inherit it held


os.register_at_fork(after_in_child=_after_fork_in_child)


# -- in place -----------------------------------------------------------------------------------


def share_(obj: Any) -> Any:
    """Move every CPU storage under ``obj`` into shared memory in place; return ``obj``.

    ``obj`` is a tensor, a storage, an ``nn.Module`` (parameters, their gradients and buffers, as
    ``Module.share_memory()``) or a dict/list/tuple/set of those, nested.  A storage that is already
    shared in the way the current sharing strategy sends it costs nothing.  CUDA, meta and empty
    storages are left alone, as by ``share_memory_``.  Sparse and nested tensors are skipped: their
    dense parts are shared when they are pickled with :func:`dumps` or by torch.
    """
    seen: set[int] = set()
    for storage in _storages(obj):
        key = storage._cdata
        if key not in seen:
            seen.add(key)
            _share_storage(storage)
    return obj


def is_shared(storage: torch.UntypedStorage) -> bool:
    """Whether torch would send ``storage`` by handle, without copying it first.

    Stricter than ``storage.is_shared()``: a storage mapped with ``UntypedStorage.from_file`` is
    "shared" but has no descriptor, and one shared for the other strategy is copied again.
    """
    if storage.device.type != "cpu" or storage.nbytes() == 0:
        return True
    if torch.multiprocessing.get_sharing_strategy() == "file_system":
        return storage.is_shared() and _shared_fd(storage) is None
    fd = _shared_fd(storage)
    return fd is not None and fd >= 0


def _shared_fd(storage: torch.UntypedStorage) -> int | None:
    try:
        # private torch API: the MapAllocator's kept descriptor; -1 when it has none
        return storage._get_shared_fd()  # type: ignore[attr-defined]
    except RuntimeError:  # not a MapAllocator storage (plain memory, or file_system's managed shm)
        return None


def _share_storage(storage: torch.UntypedStorage) -> None:
    with _lock:
        if is_shared(storage):
            return
        if not hasattr(storage, "_swap_data_ptr_") or not hasattr(os, "memfd_create"):
            storage.share_memory_()  # older torch: correct, only slower
            if not is_shared(storage):  # a mapped file: torch deems it shared, yet has no descriptor to send
                raise ValueError(
                    f"a tensor mapped from a file (torch.load(mmap=True), UntypedStorage.from_file) cannot be moved "
                    f"into shared memory in place with torch {torch.__version__} (torch >= 2.12 can): use a copy (.clone())"
                )
            return
        nbytes = storage.nbytes()
        if torch.multiprocessing.get_sharing_strategy() == "file_system":
            # torch_shm_manager must own the name, so let torch create it (it zero-fills), then
            # fill it with a kernel-side copy instead of faulting every page in from user space.
            new = torch.UntypedStorage._new_using_filename_cpu(nbytes)
            name = new._share_filename_cpu_()[1].decode()
            fd = os.open(SHM_DIR + name, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                # the file starts with the segment's refcount (64 bytes); the data follows it
                header = os.fstat(fd).st_size - nbytes
                if not 0 <= header <= 4096:
                    raise RuntimeError(f"unexpected layout of torch shared memory file {name}")
                _write_bytes(fd, storage.data_ptr(), nbytes, header)
            finally:
                os.close(fd)
        else:
            new = _memfd_copy(storage)
        storage._swap_data_ptr_(new)  # the StorageImpl now owns the mapping; ``new`` the old memory
        del new  # frees the old memory


def _memfd_copy(storage: torch.UntypedStorage) -> torch.UntypedStorage:
    """A new storage in a memfd, holding a copy of ``storage``'s bytes (written with pwrite)."""
    nbytes = storage.nbytes()
    fd = os.memfd_create("nbspawn", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, nbytes)
        _write_storage(fd, storage)
        # private torch API (what share_memory_ uses): maps a dup of fd, and keeps it
        new = torch.UntypedStorage._new_shared_fd_cpu(fd, nbytes)  # type: ignore[attr-defined]
    finally:
        os.close(fd)
    _cloexec(new)
    return cast(torch.UntypedStorage, new)


def is_pinned(storage: torch.UntypedStorage) -> bool:
    """Whether a CPU storage is page-locked (pinned) memory; False where torch cannot tell.

    Not asked before CUDA is initialized here (``_cuda.may_hold_pinned``): no memory can be pinned
    yet, and on torch < 2.7 the question itself would initialize CUDA in the kernel.  torch's default
    ``device="cuda"`` is deprecated (a DeprecationWarning per call): silenced here."""
    if not _cuda.may_hold_pinned():
        return False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return bool(storage.is_pinned())
    except RuntimeError:  # an accelerator build whose runtime cannot be asked
        return False


def _cloexec(storage: torch.UntypedStorage) -> None:
    fd = _shared_fd(storage)
    if fd is not None and fd >= 0:
        os.set_inheritable(fd, False)  # torch dup()s without O_CLOEXEC


def _write_storage(fd: int, storage: torch.UntypedStorage) -> None:
    _write_bytes(fd, storage.data_ptr(), storage.nbytes())


_memory_view = ctypes.pythonapi.PyMemoryView_FromMemory  # no ctypes array type per size (they are cached)
_memory_view.restype = ctypes.py_object
_memory_view.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int)
_PyBUF_READ = 0x100


def _write_bytes(fd: int, address: int, nbytes: int, offset: int = 0) -> None:
    """Copy ``nbytes`` at ``address`` into ``fd`` at ``offset`` with pwrite (GIL released, no page faults)."""
    view = _memory_view(address, nbytes, _PyBUF_READ)
    done = 0
    while done < nbytes:
        done += os.pwrite(fd, view[done : done + _CHUNK], offset + done)


def _leaves(obj: Any) -> Iterator[Any]:
    """Tensors and storages under ``obj``: a module's parameters, their gradients and its buffers,
    and whatever dicts, lists, tuples and sets hold, nested."""
    if isinstance(obj, (torch.Tensor, torch.UntypedStorage, torch.TypedStorage)):
        yield obj
    elif isinstance(obj, torch.nn.Module):
        for param in obj.parameters():
            yield param
            if param.grad is not None:
                yield param.grad
        yield from obj.buffers()
    elif isinstance(obj, Mapping):
        for value in obj.values():
            yield from _leaves(value)
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for value in obj:
            yield from _leaves(value)


def storage_keys(obj: Any) -> set[int]:
    """The storages (CPU and CUDA) under ``obj``, by identity: whether two objects hold the same memory
    (a view of a tensor, a module over it)."""
    keys: set[int] = set()
    with contextlib.suppress(Exception):  # what cannot be asked holds nothing known
        for leaf in _leaves(obj):
            if isinstance(leaf, torch.TypedStorage):
                leaf = leaf._untyped_storage
            if isinstance(leaf, torch.UntypedStorage):
                keys.add(leaf._cdata)
            elif leaf.layout == torch.strided and not leaf.is_nested:
                keys.add(leaf.untyped_storage()._cdata)
    return keys


def _storages(obj: Any) -> Iterator[torch.UntypedStorage]:
    """The CPU storages under ``obj`` that sharing can move (dense tensors only)."""
    for leaf in _leaves(obj):
        if isinstance(leaf, torch.TypedStorage):
            leaf = leaf._untyped_storage
        if isinstance(leaf, torch.UntypedStorage):
            if leaf.device.type == "cpu":
                yield leaf
        elif leaf.layout == torch.strided and not leaf.is_nested and leaf.device.type == "cpu":
            yield leaf.untyped_storage()


# -- kernel -> ranks ----------------------------------------------------------------------------


def movable_in_place(storage: torch.UntypedStorage) -> bool:
    """Whether ``share_`` can give ``storage`` shared memory in place: always, but on torch < 2.12 (no
    ``_swap_data_ptr_``) a file mapping without a descriptor (``torch.load(mmap=True)``) cannot be."""
    if is_shared(storage) or hasattr(storage, "_swap_data_ptr_"):
        return True
    return not (storage.device.type == "cpu" and storage.is_shared())


def _reduce_storage_shared(storage: torch.UntypedStorage) -> tuple:
    """torch's storage reduction, after the fast in-place move (torch's own would copy slowly)."""
    if storage.device.type == "cpu" and storage.nbytes():
        _share_storage(storage)
    return _torch_reductions.reduce_storage(storage)


def _reduce_storage_private(
    storage: torch.UntypedStorage, copies: dict[Any, Any] | None = None, pinned: bool | None = None
) -> tuple:
    """Sent like a shared storage, but mapped copy-on-write by the receiver.

    The rank reads the kernel's pages with no copy, and the first write to a page copies that page
    for the rank alone: kernel tensors a cell merely uses reach spawned ranks without a pickle copy,
    and a rank's writes to them never reach the kernel.

    A pinned (page-locked) storage is not moved: swapping its memory for shared pages would leave the
    kernel's tensor silently unpinned (``is_pinned()`` False, ``.to("cuda", non_blocking=True)`` from
    it no longer overlapping).  The ranks map a shared copy of it instead, made once per payload and
    kept in ``copies`` until they have started; so too a file mapping torch < 2.12 cannot move
    (``movable_in_place``).  ``pinned``: the storage's own answer unless given.
    """
    if storage.device.type != "cpu" or not storage.nbytes():
        return _torch_reductions.reduce_storage(storage)
    if (is_pinned(storage) if pinned is None else pinned) or not movable_in_place(storage):
        copies = {} if copies is None else copies
        key = ("pinned", storage._cdata)
        if key not in copies:
            if torch.multiprocessing.get_sharing_strategy() == "file_system" or not hasattr(os, "memfd_create"):
                copies[key] = torch.UntypedStorage(storage.nbytes()).copy_(storage)  # shared just below
            else:
                copies[key] = _memfd_copy(storage)
        storage = copies[key]
    if torch.multiprocessing.get_sharing_strategy() == "file_system":
        return (_cloned, (_reduce_storage_shared(storage),))  # no descriptor to map privately
    _share_storage(storage)
    fd = _shared_fd(storage)
    assert fd is not None and fd >= 0, "a storage shared under file_descriptor keeps its descriptor"
    return (_rebuild_private, (DupFd(fd), storage.nbytes()))


def _rebuild_private(dup: Any, nbytes: int) -> torch.UntypedStorage:
    fd = dup.detach()
    try:  # MAP_PRIVATE of the same memory (a memfd reopened through /proc)
        storage = torch.UntypedStorage.from_file(f"/proc/self/fd/{fd}", shared=False, nbytes=nbytes)
        return cast(torch.UntypedStorage, storage)  # typed as any storage; UntypedStorage's is one
    finally:
        os.close(fd)


def _cloned(reduced: tuple) -> Any:
    rebuild, args = reduced
    return rebuild(*args).clone()


def _reduce_code_keeping_its_file(code: types.CodeType) -> tuple:
    """cloudpickle names every code object it sends ``<dynamic-code>``: a function from an earlier
    cell, sent to a spawn or forkserver rank, would read so in its tracebacks and in pdb.  It keeps
    its cell's file name here, which the kernel and the rank's pdb name ``Cell In[3]`` (as IPython does)."""
    rebuild, args = cloudpickle.cloudpickle._code_reduce(code)  # its own reduction
    return (_code_in_file, (rebuild, args, code.co_filename))


def _code_in_file(rebuild: Any, args: tuple, filename: str) -> types.CodeType:
    return cast(types.CodeType, rebuild(*args)).replace(co_filename=filename)


class _Pickler(cloudpickle.Pickler):
    """cloudpickle, with ForkingPickler's reductions (torch's among them) ahead of copyreg's.

    Functions and classes still go through cloudpickle's ``reducer_override`` (by value when they
    live in ``__main__``).  The dispatch table is looked up by exact type: tensor subclasses that
    torch did not register fall back to ``Tensor.__reduce_ex__``, whose storage then comes here.
    """

    def __init__(
        self, file: io.BytesIO, run_prefix: str | None, shared: Collection[Any] | None = None,
        copies: dict[Any, Any] | None = None, dry: bool = False,
    ) -> None:  # fmt: skip
        own: dict[type, Any] = {types.CodeType: _reduce_code_keeping_its_file}
        self._shared_cuda: set[int] = set()
        self._private_cuda = False
        self.counters: list[_ipc.Counter] = []  # CUDA IPC reference counters this pickle set to 1 (handoff._ipc)
        # copies made for the ranks, once per payload: a CUDA tensor's on CPU, a pinned storage's in shared memory
        self._copies: dict[Any, Any] = {} if copies is None else copies
        self._dry = dry
        self.met: list[torch.Tensor] = []  # dry: every tensor the pickle reached (tensors_reached)
        if dry:  # every reduction but the data's: what would refuse to travel, found without moving a byte
            own[torch.UntypedStorage] = _no_data
        elif run_prefix is None and shared is None:
            own[torch.UntypedStorage] = _reduce_storage_shared
        elif run_prefix is None:
            keys = {storage._cdata for storage in _storages(shared)}
            self._shared_cuda = {id(t) for t in _tensors(shared) if t.device.type == "cuda"}

            def reduce(storage: torch.UntypedStorage) -> tuple:
                if storage._cdata in keys:
                    return _reduce_storage_shared(storage)
                return _reduce_storage_private(storage, self._copies)

            own[torch.UntypedStorage] = reduce
            self._private_cuda = True
        else:
            _check_prefix(run_prefix)
            exported: dict[int, tuple] = {}

            def export(storage: torch.UntypedStorage) -> tuple:
                # one file per storage per payload, so views keep sharing their storage
                key = storage._cdata
                if key not in exported:
                    exported[key] = (_import_storage, (_export_storage(storage, run_prefix),))
                return exported[key]

            own[torch.UntypedStorage] = export
        # set before Pickler.__init__, which reads dispatch_table
        self.dispatch_table = ChainMap(
            own,
            cloudpickle.Pickler._dispatch_table,
            ForkingPickler._extra_reducers,  # type: ignore[attr-defined]  # private: what ForkingPickler.register fills
            cloudpickle.Pickler.dispatch_table,
        )
        self._run_prefix = run_prefix
        super().__init__(file)

    def reducer_override(self, obj: Any) -> Any:
        if self._dry and isinstance(obj, torch.Tensor):
            self.met.append(obj)
            if obj.device.type == "cuda":
                return _no_data(obj)  # sent as CPU data or a CUDA IPC handle: nothing to refuse, nothing to copy now
        if self._run_prefix is None and isinstance(obj, torch.Tensor):
            if self._private_cuda and obj.device.type == "cuda" and id(obj) not in self._shared_cuda:
                # not --share: the data goes as CPU memory (copy-on-write, like any kernel tensor) and the
                # rank rebuilds the tensor on its own GPU once it is set up (place_arrivals)
                return _to_arrive(obj, self._copies)
            if getattr(obj, _FOR_GPU, False):  # arrived for a GPU and not yet placed (a cluster engine's names)
                return _to_arrive(obj, self._copies)
            reduce = self.dispatch_table.get(type(obj)) if obj.device.type == "cuda" else None
            if reduce is not None:  # a CUDA IPC handle: its reference counter is noted, for the kernel to release
                reduced = reduce(obj)
                self.counters.extend(_ipc.counters_in(reduced))
                return reduced
        if self._run_prefix is not None and isinstance(obj, torch.Tensor) and obj.device.type not in ("cpu", "meta"):
            # a CUDA IPC handle would die with the rank: bring a CPU copy home instead
            cpu = obj.detach().cpu()
            if isinstance(obj, torch.nn.Parameter):
                cpu = torch.nn.Parameter(cpu, requires_grad=obj.requires_grad)
            elif obj.requires_grad:
                cpu.requires_grad_()
            return (_same, (cpu,))
        return super().reducer_override(obj)


def _no_data(_obj: Any) -> tuple:
    return (bytes, ())


def check_travels(obj: Any) -> None:
    """Raise what :class:`Payload` would raise when pickled to start a rank, without moving or copying
    any tensor's data: a lock, a socket, a non-leaf tensor that requires grad (torch refuses those),
    found before any process starts."""
    _Pickler(io.BytesIO(), None, dry=True).dump(obj)


def tensors_reached(obj: Any) -> list[torch.Tensor]:
    """Every tensor that pickling ``obj`` reaches, once each: in containers, in objects' attributes,
    dataclasses and closures, a module's parameters and buffers.  What ``torch.multiprocessing.spawn``
    shares of its ``args`` (its pickler moves every storage it meets into shared memory); found
    without moving or copying a byte.  Raises what pickling ``obj`` would."""
    pickler = _Pickler(io.BytesIO(), None, dry=True)
    pickler.dump(obj)
    seen: set[int] = set()
    return [t for t in pickler.met if not (id(t) in seen or seen.add(id(t)))]  # type: ignore[func-returns-value]


class _ByValue(cloudpickle.Pickler):
    """cloudpickle, tensors with their bytes, CUDA tensors as CPU data to be placed on the receiving
    rank's GPU (what goes to other machines: their engines must never touch CUDA)."""

    dispatch_table: ClassVar[ChainMap[Any, Any]] = ChainMap(
        {types.CodeType: _reduce_code_keeping_its_file}, cloudpickle.Pickler.dispatch_table
    )

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor) and (obj.device.type == "cuda" or getattr(obj, _FOR_GPU, False)):
            return _to_arrive(obj, {})
        return super().reducer_override(obj)


def dumps_by_value(obj: Any) -> bytes:
    buf = io.BytesIO()
    _ByValue(buf).dump(obj)
    return buf.getvalue()


# -- CUDA tensors that are not shared: sent as CPU data, placed on the rank's own GPU -------------

_FOR_GPU = "_nbspawn_for_gpu"
_arrivals: list[weakref.ref[torch.Tensor]] = []  # tensors unpickled here that belong on this rank's GPU


def staged_through_host(names: Mapping[str, Any], shared: Collection[Any]) -> dict[str, int]:
    """The bytes of CUDA tensors under each name that would travel as CPU data (:func:`_to_arrive`:
    copied whole to host RAM once for the run), those not given to ``--share``; names with none left out."""
    sent_by_ipc = {id(t) for t in _tensors(shared) if t.device.type == "cuda"}  # the pickler's own rule
    seen: set[int] = set()
    sizes: dict[str, int] = {}
    for name, obj in names.items():
        total = 0
        for tensor in _tensors(obj):
            if tensor.device.type == "cuda" and id(tensor) not in sent_by_ipc and id(tensor) not in seen:
                seen.add(id(tensor))
                total += tensor.numel() * tensor.element_size()
        if total:
            sizes[name] = total
    return sizes


def _to_arrive(obj: torch.Tensor, copies: dict[Any, Any]) -> tuple:
    if obj.layout != torch.strided or obj.is_nested:
        raise TypeError(f"a {obj.layout} CUDA tensor cannot be sent to ranks without --share; make it in the cell")
    data = copies.get(id(obj))
    if data is None:
        data = obj.detach().to("cpu") if obj.device.type == "cuda" else obj.detach()
        copies[id(obj)] = data
    return (_arrive, (data, isinstance(obj, torch.nn.Parameter), obj.requires_grad))


def _arrive(data: torch.Tensor, parameter: bool, requires_grad: bool) -> torch.Tensor:
    """Unpickling: a leaf on CPU (a Parameter stays one), registered to be placed on the GPU."""
    tensor = torch.nn.Parameter(data, requires_grad=requires_grad) if parameter else data.requires_grad_(requires_grad)
    setattr(tensor, _FOR_GPU, True)
    _arrivals.append(weakref.ref(tensor))
    return tensor


def place_arrivals() -> None:
    """In a rank, once it is set up: move every CUDA tensor that arrived as CPU data onto this rank's
    current device (cuda:LOCAL_RANK), in place (the same Parameter objects, leaves, no autograd
    history), so a module and an optimizer made from it keep pointing at the same tensors."""
    pending = [t for ref in _arrivals if (t := ref()) is not None]
    _arrivals.clear()
    if not pending:
        return
    if not torch.cuda.is_available():
        print(
            f"nbspawn: {len(pending)} CUDA tensor(s) from the kernel stay on CPU: this rank sees no GPU",
            file=sys.stderr,
        )
        device = torch.device("cpu")
    else:
        device = torch.device("cuda", torch.cuda.current_device())
    with torch.no_grad():
        for tensor in pending:
            tensor.data = tensor.data.to(device)
            with contextlib.suppress(AttributeError):
                delattr(tensor, _FOR_GPU)


def forget_arrivals() -> None:
    """A cluster engine, before a run: names of earlier runs are not this run's to place."""
    _arrivals.clear()


def _same(obj: Any) -> Any:
    return obj


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    return (leaf for leaf in _leaves(obj) if isinstance(leaf, torch.Tensor))


def dumps(obj: Any, *, run_prefix: str | None = None, shared: Collection[Any] | None = None) -> bytes:
    """Pickle ``obj`` with cloudpickle; tensors and storages travel through shared memory.

    Without ``run_prefix`` (kernel to ranks): CPU storages are moved into shared memory in place
    (:func:`share_`) and sent as file descriptors, as torch.multiprocessing does.  The receiver
    must :func:`loads` the bytes exactly once, while this process is alive (see the module notes);
    to start several ranks, prefer :class:`Payload`.

    With ``run_prefix`` (a rank to the kernel, see :func:`new_run_prefix`): every CPU storage is
    written to its own file in /dev/shm named under the prefix, so the bytes stay valid after this
    process exits.  :func:`loads` in the kernel maps each file and unlinks it; load them once.
    """
    buf = io.BytesIO()
    _Pickler(buf, run_prefix, shared).dump(obj)
    return buf.getvalue()


def loads(data: bytes) -> Any:
    """Unpickle what :func:`dumps` made (in the receiving process)."""
    return cloudpickle.loads(data)


class Payload:
    """An object that is :func:`dumps`-ed only when multiprocessing pickles it to start a process.

    Put it in the arguments given to ``torch.multiprocessing.start_processes``.  Each spawn or
    forkserver child then receives its own copy of ``obj`` whose storages arrive as descriptors
    passed with the process start (no resource_sharer, nothing to leak if a rank dies early), and
    the child finds ``obj`` itself where the ``Payload`` was, through :meth:`unwrap`: the child
    unpickles it only then, once it is set up, so a failure to rebuild (a CUDA IPC handle) is the
    rank's reported error, not a silent exit code.  A fork child is not pickled for: it finds the
    ``Payload``; use :meth:`unwrap` on both sides.  Share the tensors first (:func:`share_`) if a
    forked rank's writes must reach the kernel.
    """

    __slots__ = ("copies", "counters", "obj", "sent", "shared")

    def __init__(self, obj: Any, shared: Collection[Any] | None = None) -> None:
        self.obj = obj
        self.shared = shared  # if given: only these objects' tensors are shared, the rest copy-on-write
        # CPU copies made for the ranks, made once for every rank and kept alive until they have started
        # (their descriptors must stay open meanwhile): CUDA tensors that are not shared, pinned tensors
        self.copies: dict[Any, Any] = {}
        self.sent = False
        # the CUDA IPC reference counters of every pickle made so far (one per rank): whoever reaps the ranks
        # releases those they left held (handoff._ipc.Ledger); kept after release()
        self.counters: list[_ipc.Counter] = []

    def __reduce__(self) -> tuple:
        if self.sent:
            raise RuntimeError("this payload was sent already: its objects are no longer held")
        if isinstance(self.obj, dict) and not self.obj:  # a cell that reads no kernel name: nothing to seal
            return (dict, ())
        buf = io.BytesIO()
        pickler = _Pickler(buf, None, self.shared, self.copies)
        pickler.dump(self.obj)
        self.counters.extend(pickler.counters)
        names = tuple(self.obj) if isinstance(self.obj, dict) else ()
        return (_Sealed, (buf.getvalue(), names))

    def release(self) -> None:
        """The ranks have it (pickled with their start, or sent on their pipes): hold none of its
        objects any more.  A run kept afterwards (``last_run()``, the run's spec) must not pin every
        tensor its cell used: after ``del g`` in the kernel, g's memory (GPU memory shared by CUDA IPC
        included) must be freeable, and the CPU copies made for the ranks go now."""
        self.obj, self.shared, self.copies, self.sent = None, None, {}, True

    @staticmethod
    def unwrap(value: Any) -> Any:
        if isinstance(value, _Sealed):
            return value.open()
        return value.obj if isinstance(value, Payload) else value


class _Sealed:
    """A :class:`Payload` as the receiving process has it until :meth:`Payload.unwrap` opens it."""

    __slots__ = ("data", "names", "opened")

    def __init__(self, data: bytes, names: tuple[str, ...] = ()) -> None:
        self.data = data
        self.names = names  # what the payload holds, by name (the kernel's names a cell is sent)
        self.opened = False

    def open(self) -> Any:
        """The object, handed over: opened once (the descriptors it carries are taken by the load), and
        not kept here, so that the rank's namespace is its only holder.  A rank must be able to drop
        every reference to what it received: torch gives a CUDA IPC block back to the kernel only when
        the last storage opened on it is freed (the ref counter in ``CudaIPCTypes.cpp``)."""
        if self.opened:
            raise RuntimeError("a payload is opened once")
        data, self.data, self.opened = self.data, b"", True
        try:
            return loads(data)
        except Exception as err:
            if self.names and hasattr(err, "add_note"):  # which kernel names the cell was sent (Python >= 3.11)
                err.add_note(f"nbspawn: this happened receiving the kernel's names the cell is sent: {', '.join(self.names)}")
            raise


# -- ranks -> kernel ----------------------------------------------------------------------------


def free_bytes() -> int:
    """What /dev/shm can take now (the bytes an unprivileged writer may still use)."""
    st = os.statvfs(SHM_DIR)
    return st.f_bavail * st.f_frsize


def new_run_prefix() -> str:
    """A fresh prefix for one run's files in /dev/shm: ``nbspawn.<kernel pid>.<random>.``."""
    return f"nbspawn.{os.getpid()}.{secrets.token_hex(6)}."


def _check_prefix(run_prefix: str) -> None:
    if not _PREFIX_RE.match(run_prefix):
        raise ValueError(f"not a run prefix from new_run_prefix(): {run_prefix!r}")


class _StorageHandle(NamedTuple):
    name: str  # file in SHM_DIR; "" for an empty storage
    nbytes: int


def _export_storage(storage: torch.UntypedStorage, run_prefix: str, start: int = 0, nbytes: int | None = None) -> _StorageHandle:
    """Write bytes ``[start, start + nbytes)`` of ``storage`` to a new file under ``run_prefix``."""
    if nbytes is None:
        nbytes = storage.nbytes() - start
    if nbytes == 0:
        return _StorageHandle("", 0)
    name = f"{run_prefix}{os.getpid()}.{next(_counter)}"
    path = os.path.join(SHM_DIR, name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, nbytes)
        _write_bytes(fd, storage.data_ptr() + start, nbytes)  # ENOSPC now, not SIGBUS later
    except BaseException:
        os.unlink(path)
        raise
    finally:
        os.close(fd)
    return _StorageHandle(name, nbytes)


def _import_storage(handle: tuple) -> torch.UntypedStorage:
    name, nbytes = handle
    if nbytes == 0:
        return torch.UntypedStorage()
    if not _NAME_RE.match(name):
        raise ValueError(f"not an nbspawn shared-memory name: {name!r}")
    path = os.path.join(SHM_DIR, name)
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} is gone: already imported, or swept after its run") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_size < nbytes:
            raise ValueError(f"{path} is not a tensor file written by this user")
        # private torch API (what share_memory_ uses): maps a dup of fd, which it keeps
        storage = torch.UntypedStorage._new_shared_fd_cpu(fd, nbytes)  # type: ignore[attr-defined]
    finally:
        os.close(fd)
    _cloexec(storage)
    os.unlink(path)  # the mapping and the kept descriptor hold the memory now; nothing to leak
    return storage


class TensorHandle(NamedTuple):
    """Small and picklable: what :func:`import_tensor` needs to map a tensor a rank exported."""

    storage: _StorageHandle
    dtype: torch.dtype
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    requires_grad: bool


def export_tensor(tensor: torch.Tensor, run_prefix: str) -> TensorHandle:
    """In a rank: write ``tensor`` to a file in /dev/shm under ``run_prefix``; return its handle.

    One copy, made by the rank with ``pwrite`` (its cost is the rank's, not the kernel's), of just
    the bytes the tensor spans (a small view of a big storage does not drag the storage along).
    The file outlives the rank; the kernel's :func:`import_tensor` or :func:`sweep` removes it.  A
    CUDA tensor is copied to CPU first.  For containers, modules and views that must keep sharing
    one storage, use ``dumps(obj, run_prefix=...)``.
    """
    _check_prefix(run_prefix)
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.layout != torch.strided or t.is_nested:
        raise TypeError("export_tensor handles dense (strided) tensors only; use dumps(obj, run_prefix=...)")
    if any(s < 0 for s in t.stride()):
        t = t.contiguous()
    item = t.element_size()
    if t.numel() == 0:
        start, span = 0, 0
    else:
        start = int(t.storage_offset()) * item  # typed int | SymInt; an eager tensor's is an int
        span = (1 + sum((n - 1) * s for n, s in zip(t.size(), t.stride(), strict=True))) * item
    return TensorHandle(
        _export_storage(t.untyped_storage(), run_prefix, start, span),
        t.dtype,
        tuple(t.size()),
        tuple(t.stride()),
        0,
        tensor.requires_grad,
    )


def import_tensor(handle: TensorHandle) -> torch.Tensor:
    """In the kernel: map the tensor behind ``handle`` (no copy, cost flat in size) and unlink its file.

    The result lives in shared memory (``is_shared()``), so sending it to the next run's ranks costs
    nothing more.  Import each handle once.
    """
    storage = _import_storage(handle.storage)
    t = torch.empty((0,), dtype=handle.dtype).set_(storage, handle.offset, handle.size, handle.stride)
    return t.requires_grad_() if handle.requires_grad else t


def sweep(run_prefix: str) -> int:
    """Unlink every file left under ``run_prefix`` (call after all the run's ranks have exited).

    Files a rank exported but the kernel never imported, or half-written by a rank that failed or
    was killed, are only reachable by name; this is what removes them.  Returns how many it removed.
    """
    _check_prefix(run_prefix)
    removed = 0
    for name in _shm_names():
        if name.startswith(run_prefix):
            try:
                os.unlink(os.path.join(SHM_DIR, name))
                removed += 1
            except FileNotFoundError:
                pass
    return removed


def sweep_stale() -> int:
    """Unlink this user's nbspawn files whose kernel process is gone (a kernel that crashed mid-run)."""
    removed = 0
    uid = os.getuid()
    for name in _shm_names():
        match = re.match(r"nbspawn\.(\d+)\.", name)
        if not match or _alive(int(match.group(1))):
            continue
        path = os.path.join(SHM_DIR, name)
        try:
            if os.lstat(path).st_uid == uid:
                os.unlink(path)
                removed += 1
        except FileNotFoundError:
            pass
    return removed


def _shm_names() -> list[str]:
    try:
        return os.listdir(SHM_DIR)
    except FileNotFoundError:
        return []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
