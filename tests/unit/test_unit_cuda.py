"""The CUDA decisions, as pure functions of facts passed in: they run on CPU-only CI.

What the GPU itself must prove is in tests/gpu/test_cuda.py (skipped without a GPU).
"""

from __future__ import annotations

import os
import types
from typing import Any

import pytest
import torch

from nbspawn import _cuda
from nbspawn._options import Given, StartMethod
from nbspawn._request import Settings
from nbspawn._source import CellSource
from nbspawn.cluster._plan import backend_on_nodes, gpus_of
from nbspawn.errors import SpawnUsageError
from nbspawn.executors._kept import Lost
from nbspawn.handoff import _shm
from nbspawn.handoff._names import pick_shared

# -- CUDA_VISIBLE_DEVICES, read as the CUDA runtime reads it --------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("", []),
        ("0,1", ["0", "1"]),
        (" 2, 3 ", ["2", "3"]),
        ("1gpu2,2ampere", ["1", "2"]),  # strtoul: the leading digits
        ("0,-1,1", ["0"]),  # a negative ordinal hides the rest
        ("0,0", []),  # a repeated ordinal: no device at all
        ("GPU-aa,GPU-bb", ["GPU-aa", "GPU-bb"]),
        ("MIG-1,MIG-2,0", ["MIG-1", "MIG-2"]),
    ],
)
def test_visible_devices_parse_as_torch_and_the_runtime_do(value, expected):
    assert _cuda.visible_devices(value) == expected


@pytest.mark.parametrize(
    ("value", "physical", "expected"),
    [
        (None, 8, 8),
        ("0,1", 8, 2),
        ("0,1", 1, 1),  # the runtime stops at the first ordinal that does not exist
        ("5,0", 2, 0),
        ("MIG-a,MIG-b,MIG-c", 1, 3),  # MIG devices outnumber the GPUs holding them
        ("GPU-a,GPU-b", 1, 1),
        ("", 4, 0),
    ],
)
def test_count_visible(value, physical, expected):
    assert _cuda.count_visible(value, physical) == expected


def test_gpus_are_counted_with_the_ranks_environment_not_the_kernels(monkeypatch):
    """`--env CUDA_VISIBLE_DEVICES=0,1` on a 4-GPU machine: -n auto means 2 ranks (defect 9)."""
    monkeypatch.setattr(_cuda, "compiled_with_cuda", lambda torch=None: True)
    monkeypatch.setattr(_cuda, "physical_gpus", lambda: 4)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert _cuda.gpu_count(_cuda.ranks_visible({}, os.environ)) == 4
    assert _cuda.gpu_count(_cuda.ranks_visible({"CUDA_VISIBLE_DEVICES": "0,1"}, os.environ)) == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert _cuda.gpu_count(_cuda.ranks_visible({}, os.environ)) == 1


def test_auto_ranks_are_counted_with_the_ranks_environment(monkeypatch):
    """The machine's GPUs are those the ranks will see: the cell's --env over the kernel's."""
    from nbspawn._decide import decide_ranks
    from nbspawn._machine import Machine

    monkeypatch.setattr(_cuda, "compiled_with_cuda", lambda torch=None: True)
    monkeypatch.setattr(_cuda, "physical_gpus", lambda: 4)
    monkeypatch.setattr(_cuda, "fork_facts", lambda gpus: _cuda.ForkFacts(gpus=gpus))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    settings = Settings(nprocs="auto", env={"CUDA_VISIBLE_DEVICES": "0"})
    ranks = decide_ranks(settings, Machine.here(settings.env))
    assert ranks.nprocs == 1 and ranks.start_method == "fork"
    settings = Settings(nprocs="auto", backend="auto")
    ranks = decide_ranks(settings, Machine.here(settings.env))
    assert ranks.nprocs == 4 and ranks.backend == "nccl"


def test_cuda_visible_devices_naming_mig_is_counted_without_the_cuda_runtime(monkeypatch):
    """torch.cuda.device_count() falls back on cudaGetDeviceCount (poisoning fork) for MIG- lists;
    nbspawn counts the listed devices instead."""
    monkeypatch.setattr(_cuda, "compiled_with_cuda", lambda torch=None: True)
    monkeypatch.setattr(_cuda, "physical_gpus", lambda: 1)
    monkeypatch.setattr(_cuda, "_count_in_child", lambda visible: pytest.fail("asked a child process"))
    assert _cuda.gpu_count("MIG-1,MIG-2") == 2


# -- the start method -----------------------------------------------------------------------------

METHODS = ["fork", "spawn", "forkserver"]


@pytest.mark.parametrize(
    ("facts", "blocked"),
    [
        (_cuda.ForkFacts(gpus=0), False),  # no GPU: nothing for a forked rank to lose
        (_cuda.ForkFacts(gpus=0, torch_poisoned=True), False),
        (_cuda.ForkFacts(gpus=0, torch_initialized=True), True),
        (_cuda.ForkFacts(gpus=2), False),
        (_cuda.ForkFacts(gpus=2, torch_initialized=True), True),
        (_cuda.ForkFacts(gpus=2, torch_poisoned=True), True),  # is_available() / get_arch_list() ran
        (_cuda.ForkFacts(gpus=2, driver_initialized=True), True),  # CuPy / JAX ran cuInit
        (_cuda.ForkFacts(gpus=2, driver_initialized=None), True),  # in doubt: no fork
    ],
)
def test_fork_blocker_asks_whether_a_forked_rank_could_use_cuda(facts, blocked):
    assert (_cuda.fork_blocker(facts) is not None) is blocked


def test_auto_picks_forkserver_with_a_note_when_fork_could_not_use_cuda():
    # torch.cuda.is_available()'s facts: torch's at-fork handler, and the driver initialized (cuInit)
    reason = _cuda.fork_blocker(_cuda.ForkFacts(gpus=1, torch_poisoned=True, driver_initialized=True))
    method, notes = _cuda.decide_start_method("auto", METHODS, reason)
    assert method == "forkserver"
    assert len(notes) == 1 and "uses --start-method forkserver" in notes[0] and "is_available()" in notes[0]
    assert _cuda.decide_start_method("auto", METHODS, None) == ("fork", [])
    assert _cuda.decide_start_method("auto", ["spawn"], reason) == ("spawn", [])


def test_explicit_fork_is_refused_in_nbspawns_words():
    reason = _cuda.fork_blocker(_cuda.ForkFacts(gpus=1, torch_initialized=True))
    with pytest.raises(SpawnUsageError, match=r"cannot fork: CUDA is already initialized.*forkserver"):
        _cuda.decide_start_method("fork", METHODS, reason)
    assert _cuda.decide_start_method("spawn", METHODS, reason) == ("spawn", [])
    assert _cuda.decide_start_method("fork", METHODS, None) == ("fork", [])
    with pytest.raises(SpawnUsageError, match="not available"):
        _cuda.decide_start_method("fork", ["spawn"], None)


def test_the_start_method_asks_no_gpu_facts_on_a_cpu_build(monkeypatch):
    """On CPU-only torch (this CI) nothing is probed: behaviour is what it always was."""
    from nbspawn._decide import choose_start_method
    from nbspawn._machine import Machine

    monkeypatch.setattr(_cuda, "torch_poisoned_fork", lambda: pytest.fail("forked a probe"))
    if not _cuda.compiled_with_cuda(torch):
        assert choose_start_method("auto", Machine.here()) == ("fork", [])


def test_a_poisoned_kernel_fork_probe_is_what_the_facts_say(monkeypatch):
    monkeypatch.setattr(_cuda, "compiled_with_cuda", lambda torch=None: True)
    monkeypatch.setattr(_cuda, "driver_initialized", lambda: False)
    monkeypatch.setattr(_cuda, "torch_poisoned_fork", lambda: True)
    facts = _cuda.fork_facts(2)
    assert facts.torch_poisoned and not facts.torch_initialized


def test_is_available_is_named_not_another_library_when_it_initialized_the_driver(monkeypatch):
    """torch.cuda.is_available() runs cudaGetDeviceCount, hence cuInit: the driver is initialized and
    torch's at-fork handler is registered.  torch's probe must still be asked (it used to be skipped
    once the driver said initialized), so the refusal names torch's call, not CuPy, JAX or Numba."""
    monkeypatch.setattr(_cuda, "compiled_with_cuda", lambda torch=None: True)
    monkeypatch.setattr(_cuda, "driver_initialized", lambda: True)
    monkeypatch.setattr(_cuda, "torch_poisoned_fork", lambda: True)
    facts = _cuda.fork_facts(1)
    assert facts.torch_poisoned and facts.driver_initialized
    reason = _cuda.fork_blocker(facts)
    assert reason is not None and "torch.cuda.is_available()" in reason and "CuPy" not in reason
    with pytest.raises(SpawnUsageError, match=r"cannot fork: torch\.cuda\.is_available\(\)"):
        _cuda.decide_start_method("fork", METHODS, reason)


@pytest.mark.parametrize(
    ("facts", "named"),
    [
        (_cuda.ForkFacts(gpus=1, torch_poisoned=True, driver_initialized=True), "torch.cuda.is_available()"),
        (_cuda.ForkFacts(gpus=1, torch_poisoned=True, driver_initialized=False), "torch.cuda.get_arch_list()"),
        (_cuda.ForkFacts(gpus=1, driver_initialized=True), "CuPy, JAX or Numba"),
    ],
)
def test_the_refusal_names_the_call_the_facts_point_at(facts, named):
    """cuInit ran and torch's handler is registered: is_available() (or device_count()'s fallback);
    the handler without cuInit: get_arch_list() (_cuda_getArchFlags poisons fork, initializes nothing);
    cuInit without torch's handler: another library."""
    reason = _cuda.fork_blocker(facts)
    assert reason is not None and named in reason


@pytest.mark.parametrize(
    ("source", "named"),
    [
        (
            "import torch\ndevice = 'cuda' if torch.cuda.is_available() else 'cpu'",
            "Cell In[3], line 2: device = 'cuda' if torch.cuda.is_available() else 'cpu'",
        ),
        ("# torch.cuda.is_available() in a comment\nx = torch.ones(2).cuda()", "Cell In[3], line 2: x = torch.ones(2).cuda()"),
        ("import cupy as cp\na = cp.zeros(3)", "Cell In[3], line 1: import cupy as cp"),
        ("w = torch.zeros(3, device='cuda:1')", "Cell In[3], line 1: w = torch.zeros(3, device='cuda:1')"),
        ("run_my_setup()", "Cell In[3]"),  # nothing on a line says: the cell alone
    ],
)
def test_the_cell_line_that_touched_cuda_is_found(source, named):
    assert _cuda.culprit_line("Cell In[3]", source) == named


def test_the_first_cell_that_touched_cuda_is_named_in_the_refusal(monkeypatch):
    """After each kernel cell nbspawn asks whether CUDA is now touched (the driver initialized); the
    first such cell is the culprit the refusal names, with its line (issue 25, item 1)."""
    monkeypatch.setattr(_cuda, "_culprit", None)
    monkeypatch.setattr(_cuda, "compiled_with_cuda", lambda torch=None: True)
    monkeypatch.setattr(_cuda, "driver_initialized", lambda: False)
    _cuda.note_cell("Cell In[1]", "import torch")
    assert _cuda._culprit is None  # nothing touched yet
    monkeypatch.setattr(_cuda, "driver_initialized", lambda: True)
    _cuda.note_cell("Cell In[2]", "import torch\nif torch.cuda.is_available():\n    print('gpu')")
    _cuda.note_cell("Cell In[3]", "x = torch.ones(1).cuda()")  # later cells do not replace the first
    monkeypatch.setattr(_cuda, "torch_poisoned_fork", lambda: True)
    reason = _cuda.fork_blocker(_cuda.fork_facts(1))
    assert reason is not None
    assert (
        "torch.cuda.is_available() (or device_count() where NVML cannot answer) ran in this kernel (first at Cell In[2], line 2: if torch.cuda.is_available():)"
        in reason
    )


def test_driver_facts_without_libcuda_loaded():
    """This process has no libcuda mapped (CPU torch): the driver cannot have been initialized here."""
    with open("/proc/self/maps") as fh:
        if "libcuda.so" in fh.read():
            pytest.skip("libcuda is loaded in this process")
    assert _cuda.driver_initialized() is False


# -- the backend and the devices ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "nprocs", "gpus", "expected", "noted"),
    [
        ("auto", 2, 2, "nccl", False),
        ("auto", 1, 8, "nccl", False),
        ("auto", 4, 2, "gloo", True),  # -n 4 --backend auto on 2 GPUs: not nccl (invalid device ordinal)
        ("auto", 4, 0, "gloo", False),
        ("gloo", 4, 2, "gloo", False),
        ("none", 4, 2, "none", False),
        ("nccl", 2, 2, "nccl", False),
    ],
)
def test_backend_given_gpus_and_ranks(name, nprocs, gpus, expected, noted):
    backend, note = _cuda.resolve_backend(name, nprocs, gpus)
    assert backend == expected and (note is not None) is noted
    if note:
        assert "gloo" in note and f"{nprocs} ranks" in note


@pytest.mark.parametrize(("nprocs", "gpus", "match"), [(3, 2, "one GPU per rank"), (1, 0, "none is visible")])
def test_nccl_without_a_gpu_per_rank_is_a_usage_error(nprocs, gpus, match):
    with pytest.raises(SpawnUsageError, match=match):
        _cuda.resolve_backend("nccl", nprocs, gpus)


@pytest.mark.parametrize(
    ("local_rank", "gpus", "expected"), [(0, 0, None), (3, 0, None), (0, 2, 0), (1, 2, 1), (2, 2, 0), (7, 8, 7)]
)
def test_one_rank_to_device_mapping(local_rank, gpus, expected):
    assert _cuda.rank_device(local_rank, gpus) == expected


def test_torchrun_sets_async_error_handling_unless_the_user_did():
    assert _cuda.torchrun_env({}, {}) == {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
    assert _cuda.torchrun_env({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}, {}) == {}
    assert _cuda.torchrun_env({}, {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}) == {}


def test_rank_env_carries_async_error_handling_and_the_users_value_wins(tmp_path):
    from fake_machine import machine, spec_on

    settings = Settings(nprocs=1, backend="gloo", log_dir=str(tmp_path))
    assert spec_on(settings, machine()).rank_env(0)["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    theirs = Settings(nprocs=1, backend="gloo", log_dir=str(tmp_path), env={"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"})
    assert spec_on(theirs, machine(user_env=dict(theirs.env))).rank_env(0)["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "0"
    kernels = machine({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"})  # the kernel's own: the rank inherits it
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in spec_on(settings, kernels).rank_env(0)


# -- clusters -------------------------------------------------------------------------------------


def test_nccl_socket_ifname_is_an_exact_match():
    """NCCL matches NCCL_SOCKET_IFNAME as a prefix: eth1 would also pick eth10."""
    assert _cuda.socket_interface_env("eth1", {}, {}) == {"GLOO_SOCKET_IFNAME": "eth1", "NCCL_SOCKET_IFNAME": "=eth1"}
    assert _cuda.socket_interface_env("eth1", {"NCCL_SOCKET_IFNAME": "ib0"}, {}) == {"GLOO_SOCKET_IFNAME": "eth1"}
    assert _cuda.socket_interface_env("eth1", {}, {"GLOO_SOCKET_IFNAME": "x"}) == {"NCCL_SOCKET_IFNAME": "=eth1"}
    assert _cuda.socket_interface_env(None, {}, {}) == {}


def test_agent_socket_interface_uses_the_exact_nccl_form(monkeypatch):
    from nbspawn import _listen
    from nbspawn.cluster import _agent, _net

    monkeypatch.setattr(_net, "source_address", lambda addr: "10.0.0.2")
    monkeypatch.setattr(_listen, "interface_of", lambda addr: "eth1")
    monkeypatch.delenv("NCCL_SOCKET_IFNAME", raising=False)
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    assert _agent._socket_interface("10.0.0.1", {})["NCCL_SOCKET_IFNAME"] == "=eth1"


@pytest.mark.parametrize(
    ("visible", "physical", "expected"),
    [
        ([None, None], 8, (8, None)),  # engines see every GPU
        (["0", "1", "2", "3"], 4, (4, "0,1,2,3")),  # Slurm: one GPU bound per engine
        (["3", None], 4, (4, None)),  # one engine sees them all
        (["0,1", "1,2"], 4, (3, "0,1,2")),
        ([], 2, (2, None)),
    ],
)
def test_a_nodes_gpus_come_from_every_engine(visible, physical, expected):
    assert _cuda.node_gpus(visible, physical) == expected


def test_cluster_node_gpu_count_is_not_one_engines_view():
    facts = [{"gpus": 1, "physical_gpus": 4, "cuda_visible": str(i)} for i in range(4)]
    assert gpus_of(0, facts) == (4, "0,1,2,3")
    assert gpus_of(0, [{"gpus": 2, "physical_gpus": 2, "cuda_visible": None}]) == (2, None)
    # no NVML and no /proc entries: what the engines themselves see
    assert gpus_of(0, [{"gpus": 2, "physical_gpus": None, "cuda_visible": None}]) == (2, None)


def test_cluster_backend_auto_needs_a_gpu_per_rank_on_every_node():
    from nbspawn.cluster._plan import Node

    nodes = [Node(0, "a", "a", None, 0, [0], {}, gpus=2), Node(1, "b", "b", None, 1, [1], {}, gpus=2)]
    assert backend_on_nodes(nodes, "auto", 2)[0] == "nccl"
    assert backend_on_nodes(nodes, "auto", 4)[0] == "gloo"
    with pytest.raises(SpawnUsageError, match="one GPU per rank"):
        backend_on_nodes(nodes, "nccl", 3)


# -- names: CUDA tensors that are not shared ------------------------------------------------------


def _for_gpu(t: torch.Tensor) -> torch.Tensor:
    setattr(t, _shm._FOR_GPU, True)
    return t


def test_tensors_bound_for_a_gpu_arrive_as_cpu_leaves_and_keep_parameterness(capsys):
    """What a cluster engine (or a rank) unpickles: CPU data, Parameters still Parameters and leaves,
    placed only by place_arrivals, in place; without a GPU they stay on CPU with a note."""
    weight = _for_gpu(torch.nn.Parameter(torch.ones(3)))
    index = _for_gpu(torch.arange(3))
    data = _shm.dumps_by_value({"w": weight, "i": index, "n": 3})
    _shm.forget_arrivals()
    got = _shm.loads(data)
    w, i = got["w"], got["i"]
    assert isinstance(w, torch.nn.Parameter) and w.is_leaf and w.requires_grad and w.grad_fn is None
    assert not isinstance(i, torch.nn.Parameter) and not i.requires_grad
    assert getattr(w, _shm._FOR_GPU) and len(_shm._arrivals) == 2
    before = id(w)
    _shm.place_arrivals()
    assert id(got["w"]) == before and not hasattr(w, _shm._FOR_GPU) and _shm._arrivals == []
    if not torch.cuda.is_available():
        assert w.device.type == "cpu" and "stay on CPU" in capsys.readouterr().err
    torch.optim.SGD([w], lr=0.1)  # a leaf: an optimizer takes it


def test_a_payload_opens_only_when_unwrapped():
    """A spawned rank gets a sealed payload: it is unpickled once the rank is set up (a failure is
    the rank's reported error), exactly once (its descriptors are taken by the first load)."""
    t = torch.arange(4.0)
    payload = _shm.Payload({"t": t}, shared=[])
    rebuild, args = payload.__reduce__()
    sealed = rebuild(*args)
    assert not isinstance(sealed, dict)
    first = _shm.Payload.unwrap(sealed)
    assert first["t"].tolist() == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(RuntimeError, match="opened once"):
        _shm.Payload.unwrap(sealed)


def test_an_opened_payload_holds_nothing_of_what_it_gave():
    """The rank's namespace must be the only holder of what it received: torch gives a CUDA IPC block
    back to the kernel only when the last storage opened on it is freed (issue 25, item 4)."""
    import gc
    import weakref

    payload = _shm.Payload({"t": torch.arange(4.0)}, shared=[])
    rebuild, args = payload.__reduce__()
    sealed = rebuild(*args)
    namespace = {"__name__": "__main__", **_shm.Payload.unwrap(sealed)}  # as a spawned rank makes its namespace
    received = weakref.ref(namespace["t"])
    namespace.clear()  # what the rank drops before it leaves
    gc.collect()
    assert received() is None  # the sealed payload, still alive, did not keep it


def test_a_released_payload_holds_nothing_and_cannot_be_sent_again():
    """Once the ranks have it, the kernel's payload (which the last run keeps) lets the cell's tensors
    go, and the CPU copies made for the ranks with them (issue 25, item 5)."""
    import gc
    import weakref

    t = torch.arange(4.0)
    payload = _shm.Payload({"t": t}, shared=[])
    kept = weakref.ref(t)
    payload.release()
    del t
    gc.collect()
    assert kept() is None and payload.copies == {}
    with pytest.raises(RuntimeError, match="sent already"):
        payload.__reduce__()


def test_a_kept_world_may_receive_cuda_shares_whatever_its_start_method():
    """pick_shared refuses CUDA --share only for ranks still to be forked (10b); without a GPU the
    check is exercised through its condition on a CPU tensor."""
    ns: dict[str, Any] = {"t": torch.zeros(2)}
    assert pick_shared(("t",), ns, "fork", ranks_started=True) == {"t": ns["t"]}


def test_cuda_share_refused_when_the_ranks_see_other_gpus():
    assert _cuda.same_devices("0,1", "0,1") and _cuda.same_devices(None, None)
    assert not _cuda.same_devices(None, "1") and not _cuda.same_devices("0,1", "1,0")


def test_a_world_cell_does_not_rechoose_the_start_method(tmp_path):
    """A fork world, then CUDA poisons the kernel's fork: repeating --start-method fork on the world
    is its own setting, not a new fork (10a)."""
    from fake_machine import machine

    from nbspawn._request import RunRequest
    from nbspawn._spec import RunSpec
    from nbspawn.executors import _world
    from nbspawn.planning._kept_cell import check_settings

    def cell(settings: Settings) -> RunRequest:
        return RunRequest.of(CellSource("pass"), world="w", settings=settings)

    poisoned = machine(fork_blocker="CUDA is already initialized in this kernel")
    spec = RunSpec(run_id="w", nprocs=2, start_method="fork", backend="gloo", cell=CellSource("pass"), run_dir=str(tmp_path))
    world = _world.World(name="w", spec=spec, base_dir=str(tmp_path))
    check_settings(world, cell(Settings(nprocs=2, start_method="fork", given=Given(start_method=True, nprocs=True))), poisoned)
    with pytest.raises(SpawnUsageError, match="--start-method spawn"):
        check_settings(world, cell(Settings(start_method="spawn", given=Given(start_method=True))), poisoned)


def test_a_lost_world_starts_again_with_the_start_method_the_user_asked_for(tmp_path):
    """A world whose start method auto resolved to fork is lost (an NCCL failure, with CUDA touched in
    the kernel since): its next cell resolves auto again, instead of asking for the fork it had, which
    would be refused as an explicit fork though the user never chose one (issue 25, item 6)."""
    from nbspawn._request import RunRequest
    from nbspawn._spec import RunSpec
    from nbspawn.executors import _world
    from nbspawn.planning._kept_cell import as_before

    def lost(asked: StartMethod) -> Lost:  # the world lost, asked for with --start-method ``asked``
        return _world.World(name="w", spec=spec, base_dir=str(tmp_path), asked_start_method=asked).lost_record("a rank died")

    def again_with(settings: Settings, record: Lost) -> Settings:
        return as_before(RunRequest.of(CellSource("pass"), world="w", settings=settings), record).settings

    spec = RunSpec(run_id="w", nprocs=2, start_method="fork", backend="nccl", cell=CellSource("pass"), run_dir=str(tmp_path))
    again = again_with(Settings(), lost("auto"))
    assert again.start_method == "auto" and again.nprocs == 2 and again.backend == "nccl"
    method, notes = _cuda.decide_start_method(again.start_method, METHODS, "CUDA is already initialized in this kernel")
    assert method == "forkserver" and notes  # not refused
    asked = again_with(Settings(), lost("fork"))  # the user's own --start-method fork stands
    assert asked.start_method == "fork"
    given = again_with(Settings(start_method="spawn", given=Given(start_method=True)), lost("fork"))
    assert given.start_method == "spawn"


# -- issue 41: M9 (a CUDA_VISIBLE_DEVICES changed after CUDA began), M14 (one probe fork between cells) --


def _fake_torch(initialized: bool, cached_count: int) -> types.SimpleNamespace:
    """What gpu_count asks of torch, as a CUDA build answers: torch.cuda keeps the count it had at its
    initialization."""
    return types.SimpleNamespace(
        _C=types.SimpleNamespace(_cuda_getDeviceCount=lambda: cached_count),
        cuda=types.SimpleNamespace(_initialized=initialized, device_count=lambda: cached_count),
        version=types.SimpleNamespace(hip=None),
    )


def test_a_visible_devices_change_after_cuda_began_is_counted_for_the_ranks(monkeypatch):
    """CUDA began in the kernel with 4 GPUs visible; the notebook then sets CUDA_VISIBLE_DEVICES=0.
    The ranks (new processes) see 1 GPU; torch's count is still the 4 it had at its start."""
    monkeypatch.setattr(_cuda, "_visible_at_init", [])
    monkeypatch.setattr(_cuda, "physical_gpus", lambda: 4)  # NVML's count of the machine's GPUs
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    assert _cuda.gpu_count("0,1,2,3", _fake_torch(True, 4)) == 4  # found initialized: remembered
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert _cuda.kernel_visible() == "0,1,2,3"
    assert _cuda.gpu_count("0", _fake_torch(True, 4)) == 1
    assert _cuda.gpu_count("0,1,2,3", _fake_torch(True, 4)) == 4


def test_shared_cuda_tensors_are_refused_once_the_kernel_numbers_gpus_otherwise_than_its_ranks(monkeypatch):
    """A CUDA IPC handle carries the kernel's device number, fixed when its CUDA began: a notebook that
    changed CUDA_VISIBLE_DEVICES since gives ranks another numbering, whatever the kernel's variable says now."""
    from nbspawn.handoff._names import check_shared_devices

    class OnCuda(torch.Tensor):  # a CUDA tensor, as far as the check can tell (this CI has no GPU)
        @property
        def device(self) -> torch.device:  # type: ignore[override]
            return torch.device("cuda", 0)

    shared = [torch.empty(1).as_subclass(OnCuda)]
    monkeypatch.setattr(_cuda, "_visible_at_init", ["1,0"])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(SpawnUsageError, match=r"CUDA_VISIBLE_DEVICES='0,1' in the ranks, '1,0' in the kernel"):
        check_shared_devices(shared, "0,1")
    check_shared_devices(shared, "1,0")  # the kernel's own numbering: fine


def test_one_probe_fork_between_two_kernel_cells(monkeypatch):
    """Until fork is found poisoned, each plan forked the whole kernel for the probe.  Only a kernel
    cell can poison it: between two cells (two %%spawn cells, or nbspawn.run twice in one cell) the
    answer stands."""
    import os

    forks: list[int] = []
    real_fork = os.fork

    def counted() -> int:
        forks.append(1)
        return real_fork()

    monkeypatch.setattr(_cuda, "_poisoned", False)
    monkeypatch.setattr(_cuda, "_clean_since_cell", False, raising=False)
    monkeypatch.setattr(_cuda, "compiled_with_cuda", lambda torch=None: True)
    monkeypatch.setattr(torch._C, "_cuda_isInBadFork", lambda: False, raising=False)  # the child's answer: clean
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(os, "fork", counted)
    assert not _cuda.fork_facts(1).torch_poisoned
    assert not _cuda.fork_facts(1).torch_poisoned
    assert len(forks) == 1
    _cuda.note_cell("Cell In[4]", "%%spawn -n 2\nprint('hi')")  # runs in the ranks: nothing new here
    _cuda.fork_facts(1)
    assert len(forks) == 1
    _cuda.note_cell("Cell In[5]", "import torch\ntorch.cuda.get_arch_list()")  # the kernel's own code
    _cuda.fork_facts(1)
    assert len(forks) == 2


def test_nccls_timeout_dump_goes_to_the_ranks_own_directory_and_the_error_names_it(tmp_path, monkeypatch):
    """NCCL's watchdog dumps its flight recorder when a collective times out, by default to one file per
    rank number shared by every run and kernel of the machine, and nothing said where (issue 41, M5)."""
    from fake_machine import machine, spec_on

    from nbspawn._rankdir import RankDir
    from nbspawn._runstate import Run

    settings = Settings(nprocs=2, backend="gloo", log_dir=str(tmp_path))
    spec = spec_on(settings, machine(recorder_renamed=True))
    prefix = os.path.join(spec.run_dir, "1", "nccl_trace_")
    # only the name the ranks' torch reads: on a torch from after the FlightRecorder rename the old one set
    # too would make it warn of its deprecation on every rank (the fourth GPU review's N-m3); before it,
    # torch reads only the old one, and both are set
    assert spec.rank_env(1)["TORCH_FR_DUMP_TEMP_FILE"] == prefix
    assert "TORCH_NCCL_DEBUG_INFO_TEMP_FILE" not in spec.rank_env(1)
    older = spec_on(settings, machine(recorder_renamed=False))
    older_prefix = os.path.join(older.run_dir, "1", "nccl_trace_")
    assert {k: older.rank_env(1)[k] for k in _cuda.DUMP_FILE} == dict.fromkeys(_cuda.DUMP_FILE, older_prefix)
    theirs = {"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/scratch/trace_"}  # the older name alone: torch reads it, it wins
    spec_theirs = spec_on(Settings(nprocs=1, backend="gloo", log_dir=str(tmp_path), env=theirs), machine(user_env=theirs))
    assert "TORCH_FR_DUMP_TEMP_FILE" not in spec_theirs.rank_env(0)
    assert spec_theirs.rank_env(0)["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == "/scratch/trace_"
    kernels = spec_on(settings, machine({"TORCH_FR_DUMP_TEMP_FILE": "/kernel/trace_"}))  # the kernel's: inherited
    assert not set(_cuda.DUMP_FILE) & set(kernels.rank_env(0))

    run = Run(spec)
    run.prepare_logs()
    assert run.facts().nccl_dumps == ()
    dump = RankDir(spec.rank_dir(1)).nccl_trace(1)
    assert dump == prefix + "1"  # what torch's DebugInfoWriter makes of the prefix: + the global rank
    with open(dump, "wb") as fh:
        fh.write(b"trace")
    assert run.facts().nccl_dumps == (dump,)
    from nbspawn.errors import SpawnTimeoutError

    assert f"NCCL's flight recorder, dumped at its timeout: {dump}" in str(SpawnTimeoutError(5, [], run, run.facts()))


def test_a_kept_worlds_nccl_timeout_dump_is_found_in_the_worlds_directory(tmp_path):
    """A kept world's rank is given its dump's name once, at the world's start, in the world's own
    directory; torch's writer keeps the first name it was given.  A cell's run looks there too (the
    fourth GPU review's N5: the error never named it)."""
    from nbspawn._rankdir import RankDir
    from nbspawn._runstate import Run
    from nbspawn._spec import RunSpec

    world_dir, cell_dir = tmp_path / "w-world-x", tmp_path / "w-cell-3"
    world = RunSpec(run_id="w", nprocs=2, start_method="fork", backend="nccl", cell=CellSource("pass"), run_dir=str(world_dir))
    cell = RunSpec(run_id="c", nprocs=2, start_method="fork", backend="nccl", cell=CellSource("pass"), run_dir=str(cell_dir))
    run = Run(cell)
    run.prepare_logs()
    run.ran_on_world("x", 3, str(world_dir))
    dump = RankDir(world.rank_dir(1)).nccl_trace(1)  # where the world's rank 1 was told to write it
    os.makedirs(os.path.dirname(dump))
    with open(dump, "wb") as fh:
        fh.write(b"trace")
    assert run.facts().nccl_dumps == (dump,)


def test_pinned_memory_is_asked_of_an_old_torch_only_where_a_context_exists(monkeypatch):
    """torch < 2.7 answers ``is_pinned`` with cudaPointerGetAttributes, which makes a CUDA context on
    GPU 0 in a process that has none (300-500 MB): a kernel that only asked ``is_available()`` has the
    driver initialized and no context (the fourth GPU review's N-m4).  torch >= 2.7 asks without one."""
    import types

    contexts: list[int] = []
    asked: list[int] = []

    def has_context(index: int) -> bool:
        asked.append(index)
        return index in contexts

    def a_torch(version: str) -> types.SimpleNamespace:
        return types.SimpleNamespace(
            __version__=version,
            _C=types.SimpleNamespace(_cuda_getDeviceCount=lambda: 2, _cuda_hasPrimaryContext=has_context),
            cuda=types.SimpleNamespace(is_initialized=lambda: False, device_count=lambda: 2),
        )

    monkeypatch.setattr(_cuda, "driver_initialized", lambda: True)
    monkeypatch.setattr(_cuda, "_torch", lambda: a_torch("2.6.0+cu124"))
    assert not _cuda.may_hold_pinned() and asked == [0, 1]
    contexts.append(1)  # a context on GPU 1 (a --share tensor's, say): pinned memory may exist, and asking opens none
    assert _cuda.may_hold_pinned()
    monkeypatch.setattr(_cuda, "_torch", lambda: a_torch("2.7.1"))
    contexts.clear()
    asked.clear()
    assert _cuda.may_hold_pinned() and asked == []
    monkeypatch.setattr(_cuda, "driver_initialized", lambda: False)
    assert not _cuda.may_hold_pinned()


def test_the_driver_library_is_looked_for_once_per_moment_and_kept_once_found(monkeypatch):
    """/proc/self/maps is read once per LIBCUDA_RECHECK while libcuda is not mapped (a payload asks for
    each storage: N-m5), and never again once it is (a library stays mapped)."""
    import builtins

    reads: list[str] = []
    real_open = builtins.open

    def counting_open(path, *args, **kwargs):
        if path == "/proc/self/maps":
            reads.append(path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    monkeypatch.setattr(_cuda, "_libcuda_at", [None, -1.0])
    for _ in range(100):
        _cuda._libcuda()
    assert len(reads) == 1
    _cuda._libcuda_at[1] -= _cuda.LIBCUDA_RECHECK
    _cuda._libcuda()
    assert len(reads) == 2
    monkeypatch.setattr(_cuda, "_libcuda_at", ["/usr/lib/libcuda.so.1", 0.0])
    assert _cuda._libcuda() == "/usr/lib/libcuda.so.1" and len(reads) == 2
