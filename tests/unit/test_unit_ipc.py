"""The kernel's CUDA IPC references given back for ranks that are gone, and what a rank drops when it is
stopped: the parts a CPU box can prove (issue 41, C1-C2).  The GPU outcome is in tests/gpu/test_cuda.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from torch.multiprocessing.reductions import rebuild_cuda_tensor

from nbspawn.handoff import _ipc

# -- the counters a reduction carries ------------------------------------------------------------


def _cuda_reduction(handle: bytes, offset: int) -> tuple:
    """rebuild_cuda_tensor's arguments as torch's reduce_tensor gives them (torch 2.4 .. 2.13)."""
    args = (torch.Tensor, (4,), (1,), 0, torch.TypedStorage, torch.float32, 0, b"ipc-handle", 16, 0, False)
    return (rebuild_cuda_tensor, (*args, handle, offset, b"event", True))


def test_the_counters_a_cuda_reduction_carries_are_found_nested_too():
    sparse_like = (object, ((4, 4), _cuda_reduction(b"/torch_1_2", 3), _cuda_reduction(b"/torch_1_2", 4)))
    assert _ipc.counters_in(_cuda_reduction(b"/torch_1_2", 7)) == [(b"/torch_1_2", 7)]
    assert _ipc.counters_in(sparse_like) == [(b"/torch_1_2", 3), (b"/torch_1_2", 4)]
    assert _ipc.counters_in((rebuild_cuda_tensor, (1, 2))) == []  # not the layout it knows: nothing guessed


# -- the ledger, on a counters file made by torch's own allocator ---------------------------------


@pytest.fixture
def counters_file():
    """A /dev/shm file laid out as torch's CUDA IPC counters file (a RefcountedMapAllocator mapping:
    its header, then int64 counters), and the counters as a tensor over it."""
    storage = torch.UntypedStorage._new_using_filename_cpu(8 * 16)
    name = storage._share_filename_cpu_()[1]
    counters = torch.empty(0, dtype=torch.int64).set_(storage, 0, (16,), (1,))
    yield name, counters


def test_a_counter_is_read_where_torch_keeps_it(counters_file):
    name, counters = counters_file
    counters[5] = 1
    assert [_ipc.read_counter(name, i) for i in (4, 5, 6)] == [0, 1, 0]
    assert _ipc.read_counter(b"/torch_0_0_gone", 0) is None


def test_torchs_call_that_releases_a_counter_is_there(counters_file):
    """The ledger swallows every error (a rank's counter must never fail a run's end), so a torch that
    renamed its release call would leak shared GPU memory in silence: this torch has one of the names
    nbspawn calls, and it decrements a counter as the ranks' own release does (on a CPU build it exists
    and refuses: no CUDA, nothing to release)."""
    import torch

    storage = torch.UntypedStorage
    assert hasattr(storage, "_release_ipc_counter") or hasattr(storage, "_release_ipc_counter_cuda"), torch.__version__
    name, counters = counters_file
    counters[3] = 1
    try:
        _ipc.torch_release(name, 3)
    except RuntimeError as err:  # a CPU build's binding refuses without CUDA: the call was found
        assert "CUDA" in str(err), err
    else:
        assert counters[3] == 0


def test_the_ledger_releases_only_what_the_receivers_still_hold(counters_file):
    """A rank that freed its storage set its counter to 0 itself: left alone. One killed holding it
    (or never opened it) left 1: released, once, then collected."""
    name, counters = counters_file
    counters[0], counters[1], counters[2] = 1, 0, 1  # ranks 0 and 2 died holding; rank 1 let go
    released: list[tuple[bytes, int]] = []
    collected: list[int] = []

    def release(handle: bytes, offset: int) -> None:  # what torch's _release_ipc_counter_cuda does
        released.append((handle, offset))
        counters[offset] -= 1

    ledger = _ipc.Ledger(release=release, collect=lambda: collected.append(1))
    ledger.note([(name, 0), (name, 1), (name, 2), (b"/torch_0_0_gone", 0)])
    assert ledger.release() == 2
    assert released == [(name, 0), (name, 2)] and counters[:3].tolist() == [0, 0, 0] and collected == [1]
    assert ledger.release() == 0 and collected == [1]  # nothing noted since: nothing to collect


def test_a_worlds_ledger_forgets_what_its_ranks_let_go_of_between_cells(counters_file):
    name, counters = counters_file
    counters[0], counters[1] = 1, 0  # a DDP model still holds one; the popped --share name freed the other
    ledger = _ipc.Ledger(release=lambda h, o: None, collect=lambda: None)
    ledger.note([(name, 0), (name, 1), (b"/torch_0_0_gone", 0)])
    ledger.prune()
    assert ledger.counters == [(name, 0)]


def test_a_killed_world_releases_what_its_ranks_held():
    """World.kill, once every rank is reaped (none here), releases its ledger: %spawn stop, a lost world."""
    from nbspawn.executors._world import World

    seen: list[str] = []
    world = World.__new__(World)
    world.processes, world.conns, world.killed, world.store = [], [], False, None
    world.ipc = _ipc.Ledger(
        read=lambda h, o: 1, release=lambda h, o: seen.append("released"), collect=lambda: seen.append("collected")
    )
    world.ipc.note([(b"/torch_1_1", 0)])
    world.kill()
    assert seen == ["released", "collected"]


# -- a rank stopped by SIGTERM ----------------------------------------------------------------------

_RANK = """
import signal, sys, threading, time
from nbspawn.ranks import _stackdump, _stopped
if sys.argv[1] == "answering":  # as a rank sets itself up: the stack answers read the wakeup descriptor first
    _stackdump.answer_stack_requests(open(sys.argv[2], "w"))
_stopped.install(lambda: print("dropped", threading.current_thread().name, flush=True), last_words=lambda: print("last words", flush=True))
if sys.argv[1] == "stuck":
    # the main thread stays in C (as in a gloo or NCCL wait): SIGTERM lands on another thread, and Python's
    # handler would run only once the main thread came back.  A rank has such threads (torch's, gloo's);
    # this one stands for them (importing nbspawn no longer imports torch, whose threads it used to be)
    threading.Thread(target=time.sleep, args=(300,), daemon=True).start()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
if sys.argv[1] == "elsewhere":
    # the kernel hands the signal to another thread (the main one had one pending): the main one sleeps on
    def elsewhere():
        time.sleep(1.0)
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
        time.sleep(300)
    threading.Thread(target=elsewhere, daemon=True).start()
print("ready", flush=True)
time.sleep(300)
"""


def _asleep(pid: int, timeout: float = 30) -> None:
    """Wait until ``pid``'s main thread is asleep at three looks in a row, 0.1 s apart (a hang guard)."""
    import psutil

    deadline, asleep = time.monotonic() + timeout, 0
    while asleep < 3:
        asleep = asleep + 1 if psutil.Process(pid).status() == psutil.STATUS_SLEEPING else 0
        assert time.monotonic() < deadline, f"{pid} never asleep"
        time.sleep(0.1)


@pytest.mark.parametrize("where", ["python", "elsewhere", "stuck", "answering"])
def test_a_rank_told_to_stop_drops_its_names_or_dies_at_once(where, tmp_path):
    """SIGTERM: the rank drops what it received (in its main thread, wherever the signal landed) and
    dies of the signal; one stuck in C dies of it within PATIENCE, not after the grace period's SIGKILL.
    Its last words (the X-ray written down) are said first, once, stuck in C or not: from the thread
    that heard the signal.  A rank answering stack requests still answers them (one reader of the
    wakeup descriptor)."""
    stacks = tmp_path / "stacks.log"
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_RANK), where, str(stacks)], stdout=subprocess.PIPE, text=True, env=os.environ
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"
    _asleep(proc.pid)  # in time.sleep by now: seen, not assumed half a second later
    if where == "answering" and sys.version_info >= (3, 11):
        proc.send_signal(signal.SIGUSR1)  # the kernel's "where are you?" first, as before a stop
        # it answers where its main thread is: the script's last line, its time.sleep (faulthandler names
        # the line, not the C function in it)
        sleeping = textwrap.dedent(_RANK).rstrip("\n").count("\n") + 1
        place = f'File "<string>", line {sleeping} in <module>'
        deadline = time.monotonic() + 30  # a hang guard
        while place not in stacks.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert place in stacks.read_text(), stacks.read_text()
    began = time.monotonic()
    if where != "elsewhere":
        proc.send_signal(signal.SIGTERM)
    rest = proc.communicate(timeout=120)[0]
    assert proc.returncode == -signal.SIGTERM
    # at once, or within PATIENCE stuck in C: far sooner than the 300 s sleep it would otherwise end with
    assert time.monotonic() - began < 60
    assert rest == "last words\n" + ("" if where == "stuck" else "dropped MainThread\n")


_FORKS = """
import os, signal, sys, threading, time
from nbspawn.ranks import _stackdump, _stopped
_stackdump.answer_stack_requests(open(sys.argv[1], "w"))
_stopped.install(lambda: None)

def masked():
    return signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, [])

def fork_and_look():
    pid = os.fork()
    if pid == 0:  # the child: SIGTERM no longer held, the rank's handler and pipe let go of
        os._exit(0 if not masked() and signal.set_wakeup_fd(-1) == -1 and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL else 3)
    return os.waitpid(pid, 0)[1], masked()

print(fork_and_look())
# a thread of the rank's that holds SIGTERM itself (its helpers do) keeps it held, in the rank and in its child
def helper():
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    pid = os.fork()
    if pid == 0:
        os._exit(0 if masked() else 3)
    print((os.waitpid(pid, 0)[1], masked()))
threading.Thread(target=helper).start()
"""


def test_a_ranks_fork_holds_sigterm_only_until_the_child_has_let_go_of_the_ranks_handler(tmp_path):
    """A rank forks with SIGTERM held (``ranks._stopped``): a child terminated at once (``with Pool(2)``
    as its map ends) would otherwise write the signal to the rank's wakeup pipe, and the rank would die
    of its child's SIGTERM.  After the fork the mask is as it was, in the rank and in the child."""
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_FORKS), str(tmp_path / "stacks.log")],
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ,
    )
    assert out.stdout.splitlines() == ["(0, False)", "(0, True)"], out


# -- the pinned-memory probe (L1, M12) -------------------------------------------------------------


def test_pinned_memory_is_not_asked_of_torch_before_cuda_is_initialized(monkeypatch):
    """On torch < 2.7 ``is_pinned()`` initializes CUDA (a context on GPU 0, and a kernel that can no
    longer fork its ranks): nbspawn asks only once CUDA is initialized, when pinned memory can exist,
    and torch's deprecation warning for its ``device`` default is not the user's (issue 41, L1, M12)."""
    import warnings

    from nbspawn import _cuda
    from nbspawn.handoff import _shm

    initialized = {"driver": False}
    asked: list[int] = []

    def is_pinned(self, device="cuda"):
        if not initialized["driver"]:
            raise AssertionError("is_pinned() asked before CUDA was initialized: it would initialize it")
        asked.append(1)
        warnings.warn("The argument 'device' of Tensor.is_pinned() is deprecated", DeprecationWarning, stacklevel=2)
        return True

    monkeypatch.setattr(torch.UntypedStorage, "is_pinned", is_pinned)
    monkeypatch.setattr(_cuda, "compiled_with_cuda", lambda torch=None: True)  # as on a CUDA build
    monkeypatch.setattr(_cuda, "driver_initialized", lambda: initialized["driver"])
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    storage = torch.ones(4).untyped_storage()
    assert _shm.is_pinned(storage) is False and not asked
    initialized["driver"] = True  # cuInit ran (a CUDA tensor, torch.cuda.is_available())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _shm.is_pinned(storage) is True
    assert asked == [1] and not caught


# -- NCCL subgroups aborted (M7) ----------------------------------------------------------------------


class ProcessGroupNCCL:  # named as torch's: what abort_groups recognises
    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name = log, name

    def abort(self) -> None:
        self.log.append(self.name)


class _Group:
    def __init__(self, backend: object | None) -> None:
        self.backend = backend

    def _get_backend(self, device: torch.device) -> object:
        if self.backend is None:
            raise RuntimeError("no backend for cuda")
        return self.backend


def test_a_failed_rank_aborts_nccl_subgroups_of_a_gloo_default_group(monkeypatch):
    """A gloo default group with ``new_group(backend="nccl")``: only an NCCL default group was aborted,
    so a pending subgroup collective kept the failed rank's GPU from settling, and it left without
    giving back what it received (issue 41, M7)."""
    import types

    from nbspawn.ranks import _cell

    log: list[str] = []

    class Gloo:
        def abort(self) -> None:
            log.append("gloo")

    world = types.SimpleNamespace(
        pg_map={
            _Group(None): 0,
            _Group(ProcessGroupNCCL(log, "sub-a")): 1,
            _Group(Gloo()): 2,
            _Group(ProcessGroupNCCL(log, "sub-b")): 3,
        }
    )
    fake = types.SimpleNamespace(
        is_available=lambda: True,
        is_initialized=lambda: True,
        get_backend=lambda: "gloo",
        distributed_c10d=types.SimpleNamespace(_world=world, _abort_process_group=lambda: log.append("all")),
    )
    monkeypatch.setitem(sys.modules, "torch.distributed", fake)
    _cell.abort_groups()
    assert log == ["sub-a", "sub-b"]
    log.clear()
    fake.get_backend = lambda: "nccl"  # an NCCL default group: torch's own call aborts every group at once
    _cell.abort_groups()
    assert log == ["all"]


# -- a CUDA error is the cell's, not --out's (M6) -------------------------------------------------------


def test_a_cuda_error_after_the_cell_is_told_as_itself_not_as_an_out_value(monkeypatch, tmp_path):
    """A device-side assert surfaces at the next synchronizing call: --out's copy to CPU came first and
    reported it as "--out: cannot send 'x' (a value)".  The GPU is settled before --out (issue 41, M6)."""
    from nbspawn._source import CellSource
    from nbspawn._spec import RunSpec
    from nbspawn.handoff import _names
    from nbspawn.ranks import _cell

    assert_error = RuntimeError("CUDA error: device-side assert triggered")
    broken = {"gpu": False}

    def settle(timeout, interruptible=False):
        if broken["gpu"]:
            raise assert_error
        return True

    def send_outputs(namespace, names, prefix, rank_dir):  # its .cpu() meets the sticky error first
        if broken["gpu"]:
            raise RuntimeError(f"--out: cannot send 'x' (a value) back to the kernel: {assert_error}")

    monkeypatch.setattr(_cell, "settle_devices", settle)
    monkeypatch.setattr(_names, "send_outputs", send_outputs)
    monkeypatch.setattr(_cell._children, "install", lambda namespace=None: None)
    cell = CellSource("x = 1\nbroken['gpu'] = True")
    spec = RunSpec(
        run_id="r",
        nprocs=1,
        start_method="spawn",
        backend="none",
        cell=cell,
        run_dir=str(tmp_path),
        out_names=("x",),
        shm_prefix="nbspawn.1.abc.",
    )
    with pytest.raises(RuntimeError) as raised:
        _cell._run_cell(spec, 0, None, {"broken": broken})
    assert raised.value is assert_error


# -- a CUDA name too big to stage through host RAM (M13) ---------------------------------------------


class _OnGpu(torch.Tensor):
    """A CPU tensor that says it is on a GPU: enough for what reads only its device and size."""

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device("cuda", 0)


def test_a_cuda_name_too_big_for_host_ram_is_refused_with_share_as_the_way_out(monkeypatch):
    """A kernel CUDA tensor a cell reads without --share is copied whole to host RAM: above half the
    RAM available it is refused, in one line, before any process starts (issue 41, M13)."""
    import ast
    import types

    import psutil

    from nbspawn.errors import SpawnUsageError
    from nbspawn.handoff import _names

    model = torch.Tensor._make_subclass(_OnGpu, torch.zeros(1000))  # 4000 bytes "on the GPU"
    monkeypatch.setattr(psutil, "virtual_memory", lambda: types.SimpleNamespace(available=6000))
    tree = ast.parse("print(model.sum())")
    with pytest.raises(SpawnUsageError) as refused:
        _names.pack_namespace(tree, {"model": model})
    said = str(refused.value)
    assert "\n" not in said and "'model' holds 0.0 GB of CUDA tensors" in said and "--share model" in said, said
    payload = _names.pack_namespace(tree, {"model": model}, shared={"model": model})  # shared: by IPC, no copy
    assert payload.shared == [model]
    monkeypatch.setattr(psutil, "virtual_memory", lambda: types.SimpleNamespace(available=10_000))
    assert _names.pack_namespace(tree, {"model": model}).obj == {"model": model}  # fits: as before
