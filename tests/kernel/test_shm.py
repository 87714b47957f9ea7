"""nbspawn.handoff._shm with real child processes: in-place sharing, kernel -> rank payloads, rank -> kernel results.

Every test that starts processes checks what it leaves behind: no new nbspawn or torch segment of this
process in /dev/shm, and no new open file descriptor in this process once the tensors are dropped.
"""

from __future__ import annotations

import gc
import os
import pickle
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

try:
    import nbspawn.handoff._shm  # noqa: F401
except ImportError:  # not installed: test the checkout (spawned children inherit sys.path)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch
import torch.multiprocessing as mp

from nbspawn.handoff import _shm

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux shared memory")

MiB = 1 << 20
METHODS = ["fork", "spawn", "forkserver"]


# -- helpers ------------------------------------------------------------------------------------


def _fds() -> set[int]:
    """Open descriptors; the one listdir used to read /proc/self/fd is closed by now and left out."""
    return {int(fd) for fd in os.listdir("/proc/self/fd") if os.path.lexists(f"/proc/self/fd/{fd}")}


def _mine_in_shm() -> set[str]:
    pid = os.getpid()
    return {n for n in os.listdir("/dev/shm") if n.startswith((f"nbspawn.{pid}.", f"torch_{pid}_"))}


@pytest.fixture
def no_leaks():
    """Fail if the test leaves a segment in /dev/shm or an open descriptor in this process."""
    gc.collect()
    fds, shm = _fds(), _mine_in_shm()
    yield
    gc.collect()
    assert _mine_in_shm() <= shm, "left in /dev/shm"
    leaked = _fds() - fds - _resource_sharer_listener()
    deadline = time.monotonic() + 10.0
    while leaked and time.monotonic() < deadline:  # a leak persists; a closing thread's fd does not (10 s: a loaded machine's)
        time.sleep(0.05)
        gc.collect()
        leaked = _fds() - fds - _resource_sharer_listener()
    assert not leaked, {fd: _describe(fd) for fd in leaked}


def _resource_sharer_listener() -> set[int]:
    """multiprocessing's resource_sharer opens one listening socket on first use and keeps it for the
    process's life (by design): the first test that sends a descriptor that way must not count it."""
    from multiprocessing import resource_sharer

    listener = getattr(resource_sharer._resource_sharer, "_listener", None)
    try:
        return {listener._listener._socket.fileno()} if listener is not None else set()
    except AttributeError:
        return set()


def _describe(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return "?"


@pytest.fixture(scope="module", autouse=True)
def _warm_start_methods():
    """The first start of each method opens process-wide descriptors (forkserver, resource tracker)."""
    for method in METHODS:
        mp.start_processes(_noop, nprocs=1, start_method=method)
    _shm.loads(_shm.dumps(torch.ones(1)))  # starts multiprocessing's resource_sharer listener


@pytest.fixture
def file_system_strategy():
    old = mp.get_sharing_strategy()
    mp.set_sharing_strategy("file_system")
    yield
    mp.set_sharing_strategy(old)


def _child(rank: int) -> None:
    # A forked child must not enter an OpenMP parallel region the kernel already used: GNU libgomp
    # is not fork-safe and hangs in its barrier (torch's DataLoader workers do the same).
    torch.set_num_threads(1)


def _noop(rank: int) -> None:
    pass


def _fill(rank: int, tensor: torch.Tensor, value: float) -> None:
    _child(rank)
    assert tensor.is_shared()
    tensor.fill_(value + rank)


def _sums_to(rank: int, payload, total: int) -> None:
    _child(rank)
    assert int(_shm.Payload.unwrap(payload)["t"].sum()) == total


def _fill_views(rank: int, views: list[torch.Tensor]) -> None:
    _child(rank)
    views[rank].fill_(rank + 1)


def _load_and_fill(rank: int, payload: bytes) -> None:
    _child(rank)
    obj = _shm.loads(payload)
    obj["fn"](obj["t"], rank)


def _payload_fill(rank: int, payload) -> None:
    _child(rank)
    obj = _shm.Payload.unwrap(payload)
    obj["t"][rank].fill_(obj["scale"](rank))


def _send_back(rank: int, run_prefix: str, out: str, mib: int) -> None:
    _child(rank)
    t = torch.arange(mib * MiB // 4, dtype=torch.float32)
    result = {"t": t, "view": t[10:20], "model": torch.nn.Linear(3, 2), "sum": float(t.double().sum())}
    Path(out).write_bytes(_shm.dumps(result, run_prefix=run_prefix))


def _export_and_raise(rank: int, run_prefix: str) -> None:
    _child(rank)
    _shm.export_tensor(torch.ones(MiB), run_prefix)
    # both ranks export before either raises (torch stops the others at the first failure, and a
    # slow rank must not be stopped before it exported)
    deadline = time.monotonic() + 30
    while len([n for n in os.listdir("/dev/shm") if n.startswith(run_prefix)]) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    raise RuntimeError("the cell failed after exporting")


def _killed_mid_write(rank: int, run_prefix: str) -> None:
    _child(rank)
    real = _shm._write_bytes

    def half_then_sigkill(fd: int, address: int, nbytes: int) -> None:
        real(fd, address, nbytes // 2)
        os.kill(os.getpid(), signal.SIGKILL)

    _shm._write_bytes = half_then_sigkill
    _shm.export_tensor(torch.ones(16 * MiB), run_prefix)


# -- share_ -------------------------------------------------------------------------------------


def test_share_in_place_moves_views_and_is_free_the_second_time(no_leaks):
    base = torch.arange(64 * MiB // 4, dtype=torch.float32)
    view, reshaped = base[100:200], base.view(-1, 4)
    old = base.data_ptr()
    assert _shm.share_(base) is base
    assert base.is_shared() and view.is_shared() and reshaped.is_shared()
    assert base.data_ptr() != old and view.data_ptr() == base.data_ptr() + 400
    assert torch.equal(view, torch.arange(100, 200, dtype=torch.float32))
    storage = base.untyped_storage()
    fd = storage._get_shared_fd()
    assert fd >= 0 and not os.get_inheritable(fd)
    # torch's own reduction now finds it shared: no second move, no copy
    assert storage._share_fd_cpu_() == (fd, 64 * MiB)
    ptr = base.data_ptr()
    for _ in range(100):
        _shm.share_(base)
    # nothing moved or copied: the same memory, the same descriptor (how fast that is: bench/shm_micro.py)
    assert base.data_ptr() == ptr and storage._get_shared_fd() == fd
    view.fill_(7)
    assert base[150].item() == 7


def test_share_module_and_containers(no_leaks):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    model(torch.randn(3, 4)).sum().backward()
    extra = {"a": [torch.ones(3), (torch.zeros(2),)], "b": torch.empty(0), "c": "text"}
    _shm.share_([model, extra])
    assert all(p.is_shared() and p.grad.is_shared() for p in model.parameters())
    assert all(b.is_shared() for b in model.buffers() if b.numel())
    assert extra["a"][0].is_shared() and extra["a"][1][0].is_shared()


def test_share_empty_and_small(no_leaks):
    empty, one = torch.empty(0), torch.tensor([3.0])
    _shm.share_([empty, one])
    assert one.is_shared() and one.item() == 3.0
    assert pickle.loads(pickle.dumps(_shm.share_(torch.zeros(0)))).numel() == 0


def test_share_replaces_a_from_file_mapping_that_has_no_descriptor(tmp_path, no_leaks):
    path = tmp_path / "blob"
    path.write_bytes(bytes(range(16)))
    t = torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage.from_file(str(path), shared=True, nbytes=16))
    assert t.is_shared() and not _shm.is_shared(t.untyped_storage())  # torch would DupFd(-1)
    if not hasattr(t.untyped_storage(), "_swap_data_ptr_"):  # torch < 2.12 (Colab's, Kaggle's): said, and sent as a copy
        assert not _shm.movable_in_place(t.untyped_storage())
        with pytest.raises(ValueError, match=r"mapped from a file .* use a copy \(\.clone\(\)\)"):
            _shm.share_(t)
        # a cell that only uses it: its ranks get a copy (spawn: the payload copies it once, as a pinned one)
        mp.start_processes(_sums_to, args=(_shm.Payload({"t": t}, shared=[]), 120), nprocs=1, start_method="spawn")
        return
    _shm.share_(t)
    assert _shm.is_shared(t.untyped_storage()) and t.tolist() == list(range(16))


@pytest.mark.parametrize("method", METHODS)
def test_child_writes_reach_the_kernel(method, no_leaks):
    t = torch.zeros(64 * MiB // 4)
    _shm.share_(t)
    ptr, fd = t.data_ptr(), t.untyped_storage()._get_shared_fd()
    mp.start_processes(_fill, args=(t, 5.0), nprocs=1, start_method=method)
    assert t[0].item() == 5.0 and t[-1].item() == 5.0
    assert t.data_ptr() == ptr and t.untyped_storage()._get_shared_fd() == fd  # sent by handle


@pytest.mark.parametrize("method", METHODS)
def test_views_of_one_storage_stay_one_storage_in_children(method, no_leaks):
    base = torch.zeros(2, 1000)
    _shm.share_(base)
    mp.start_processes(_fill_views, args=([base[0], base[1]],), nprocs=2, start_method=method)
    assert base[0].eq(1).all() and base[1].eq(2).all()


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_file_system_strategy(method, file_system_strategy):
    t = torch.arange(8 * MiB // 4, dtype=torch.float32)
    view = t[-10:]
    _shm.share_(t)
    assert t.is_shared() and _shm.is_shared(t.untyped_storage())
    assert torch.equal(t, torch.arange(8 * MiB // 4, dtype=torch.float32)) and view[-1].item() == t.numel() - 1
    name = t.untyped_storage()._share_filename_cpu_()[1].decode()
    _shm.share_(t)
    assert t.untyped_storage()._share_filename_cpu_()[1].decode() == name  # not moved again
    mp.start_processes(_fill, args=(view, 3.0), nprocs=1, start_method=method)
    assert t[-1].item() == 3.0 and t[-11].item() == t.numel() - 11
    # The segment's refcount (its first bytes, which share_ must not overwrite) frees it.  Once a
    # child has mapped it, torch_shm_manager removes it when the kernel exits, as for share_memory_.
    u = _shm.share_(torch.ones(1000))
    name = u.untyped_storage()._share_filename_cpu_()[1].decode()
    assert os.path.exists("/dev/shm" + name)
    del u
    gc.collect()
    assert not os.path.exists("/dev/shm" + name)


# -- kernel -> ranks ----------------------------------------------------------------------------


def test_dumps_256mib_to_spawn_child_sends_a_handle_not_the_data(no_leaks):
    t = torch.zeros(256 * MiB // 4)  # not shared yet: dumps moves it in place

    def fn(tensor, rank):  # defined here, like a notebook function: cloudpickle sends it by value
        tensor[rank::1000].fill_(42.0)

    payload = _shm.dumps({"t": t, "fn": fn})
    assert len(payload) < 4096
    assert t.is_shared()
    mp.start_processes(_load_and_fill, args=(payload,), nprocs=1, start_method="spawn")
    assert t[0].item() == 42.0 and t[1000].item() == 42.0 and t[1].item() == 0.0
    del payload


@pytest.mark.parametrize("method", ["spawn", "forkserver", "fork"])
def test_payload_passes_descriptors_with_the_process_start(method, no_leaks):
    from multiprocessing import resource_sharer

    t = torch.zeros(2, 4 * MiB)

    def scale(rank):
        return 10.0 * (rank + 1)

    if method == "fork":
        _shm.share_(t)  # a forked rank is not pickled for: share first so its writes come back
    pending = dict(getattr(resource_sharer._resource_sharer, "_cache", {}))
    mp.start_processes(_payload_fill, args=(_shm.Payload({"t": t, "scale": scale}),), nprocs=2, start_method=method)
    assert t[0].eq(10.0).all() and t[1].eq(20.0).all()
    assert dict(getattr(resource_sharer._resource_sharer, "_cache", {})) == pending  # no tickets left


def test_a_pinned_storage_is_sent_as_a_copy_and_stays_where_it_is(no_leaks):
    """A kernel tensor a cell merely uses is moved into shared memory in place, unless it is pinned:
    moving it would leave the kernel's tensor silently unpinned.  The ranks then get a shared copy,
    made once per payload (issue 25, item 10).  CPU-only torch cannot pin, so the storage's answer is
    given here; the real pinned tensor is tests/gpu/test_cuda.py's."""
    t = torch.arange(1000.0)
    storage = t.untyped_storage()
    address = storage.data_ptr()
    copies: dict = {}
    rebuild, args = _shm._reduce_storage_private(storage, copies, pinned=True)
    again = _shm._reduce_storage_private(storage, copies, pinned=True)
    assert storage.data_ptr() == address and not storage.is_shared()  # the kernel's memory is untouched
    assert len(copies) == 1  # one copy, whatever views of the storage the payload holds
    received = rebuild(*args)
    assert torch.equal(torch.empty(0).set_(received), t)
    again[0](*again[1])  # take the second ticket too (nothing left with the resource sharer)
    unpinned = torch.arange(10.0)
    rebuild, args = _shm._reduce_storage_private(unpinned.untyped_storage(), {}, pinned=False)
    assert unpinned.is_shared()  # not pinned: moved in place, as before
    rebuild(*args)


# -- ranks -> kernel ----------------------------------------------------------------------------


def _mapping_of(address: int) -> str:
    """The path of this process's mapping that holds ``address`` ("" for anonymous memory)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if start <= address < end:
                return fields[5].strip() if len(fields) > 5 else ""
    raise AssertionError(f"{address:#x} is in no mapping")


# not alone any more: it times nothing (it timed the 256 MiB mapping, which other tests' ranks could delay)
def test_results_come_back_after_the_rank_exits(tmp_path, no_leaks):
    prefix = _shm.new_run_prefix()
    out = tmp_path / "out.pkl"
    mp.start_processes(_send_back, args=(prefix, str(out), 256), nprocs=1, start_method="spawn")
    data = out.read_bytes()
    assert len(data) < 8192
    files = [n for n in os.listdir("/dev/shm") if n.startswith(prefix)]
    assert len(files) == 3  # t (with its view), weight, bias
    rss = psutil.Process().memory_info().rss
    result = _shm.loads(data)
    grew = psutil.Process().memory_info().rss - rss
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(prefix)]  # unlinked on import
    # mapping, not copying, 256 MiB: the tensor's memory is the rank's segment, mapped, and none of it was
    # read in yet (how fast the mapping is: bench/shm_micro.py; 50 ms did not even tell a map from a copy)
    t = result["t"]
    assert _mapping_of(t.untyped_storage().data_ptr()).startswith(f"/dev/shm/{prefix}"), _mapping_of(t.data_ptr())
    assert grew < 64 * MiB, grew
    assert t.is_shared() and _shm.is_shared(t.untyped_storage())
    assert result["view"].untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
    assert float(t.double().sum()) == result["sum"] and result["view"][0].item() == 10.0
    assert isinstance(result["model"], torch.nn.Linear) and result["model"].weight.requires_grad
    assert _shm.sweep(prefix) == 0
    # imported tensors go back out to the next run by handle, without another copy
    payload = _shm.dumps(t)
    assert len(payload) < 4096 and _shm.loads(payload).data_ptr() == t.data_ptr()
    del result, t


def test_rank_that_raises_after_exporting_is_swept(no_leaks):
    prefix = _shm.new_run_prefix()
    with pytest.raises(mp.ProcessRaisedException):
        mp.start_processes(_export_and_raise, args=(prefix,), nprocs=2, start_method="spawn")
    assert len([n for n in os.listdir("/dev/shm") if n.startswith(prefix)]) == 2
    assert _shm.sweep(prefix) == 2
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(prefix)]


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_rank_killed_mid_write_is_swept(method, no_leaks):
    prefix = _shm.new_run_prefix()
    with pytest.raises(mp.ProcessExitedException):
        mp.start_processes(_killed_mid_write, args=(prefix,), nprocs=1, start_method=method)
    left = [n for n in os.listdir("/dev/shm") if n.startswith(prefix)]
    assert len(left) == 1
    assert _shm.sweep(prefix) == 1
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(prefix)]


def test_export_import_tensor_handle(no_leaks):
    prefix = _shm.new_run_prefix()
    big = torch.arange(1000.0)
    view = big[100:400:3].requires_grad_()
    handle = _shm.export_tensor(view, prefix)
    assert len(pickle.dumps(handle)) < 1024 and handle.storage.nbytes == (1 + 99 * 3) * 4
    back = _shm.import_tensor(pickle.loads(pickle.dumps(handle)))
    assert torch.equal(back.detach(), view.detach()) and back.requires_grad and back.is_shared()
    with pytest.raises(FileNotFoundError, match="already imported"):
        _shm.import_tensor(handle)
    empty = _shm.import_tensor(_shm.export_tensor(torch.empty(0, 5), prefix))
    assert empty.shape == (0, 5)
    assert _shm.sweep(prefix) == 0
    del back


def test_prefixes_are_checked():
    with pytest.raises(ValueError):
        _shm.sweep("")
    with pytest.raises(ValueError):
        _shm.export_tensor(torch.ones(1), "../etc/")
    with pytest.raises(ValueError):
        _shm._import_storage(("../../etc/passwd", 10))


def test_sweep_stale_removes_files_of_dead_kernels_only():
    dead = 1
    while _shm._alive(dead):
        dead += 7919
    stale = Path("/dev/shm") / f"nbspawn.{dead}.abcd.{dead}.0"
    live = Path("/dev/shm") / f"{_shm.new_run_prefix()}{os.getpid()}.0"
    stale.write_bytes(b"x")
    live.write_bytes(b"x")
    try:
        assert _shm.sweep_stale() >= 1
        assert not stale.exists() and live.exists()
    finally:
        for p in (stale, live):
            p.unlink(missing_ok=True)
