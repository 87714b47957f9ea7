"""What the ranks are, decided from the settings and a machine's facts (``nbspawn._decide``), on fake
machines: no GPU, no monkeypatch, no process.  A fact a decision does not need is never asked (a
probe that raises here would fail the test)."""

from __future__ import annotations

from functools import cached_property

import pytest
from fake_machine import PLAIN as PLAIN_TOLD
from fake_machine import machine

from nbspawn._capacity import Room
from nbspawn._decide import decide_ranks
from nbspawn._machine import Machine, Told
from nbspawn._program import Program
from nbspawn._request import Settings
from nbspawn._tpu import LAUNCHER_KEYS, TpuPlan
from nbspawn.errors import SpawnUsageError


class Unasked(Machine):
    """A machine whose GPUs and fork facts must not be asked (they would probe, or fork a child)."""

    @cached_property
    def gpus(self) -> int:
        raise AssertionError("counted the GPUs")

    @cached_property
    def fork_blocker(self) -> str | None:
        raise AssertionError("asked whether fork is safe")


def test_auto_on_a_cpu_machine_is_up_to_four_ranks_sharing_its_cores():
    ranks = decide_ranks(Settings(nprocs="auto", backend="auto"), machine(cpus=8, gpus=0))
    assert (ranks.nprocs, ranks.start_method, ranks.backend, ranks.omp_threads) == (4, "fork", "gloo", 2)
    assert ranks.notes == () and ranks.kernel_env is None


def test_auto_on_gpus_is_a_rank_per_gpu_on_nccl():
    ranks = decide_ranks(Settings(nprocs="auto", backend="auto"), machine(cpus=32, gpus=2))
    assert (ranks.nprocs, ranks.backend, ranks.omp_threads) == (2, "nccl", 16)


def test_more_ranks_than_gpus_fall_back_on_gloo_and_say_so():
    ranks = decide_ranks(Settings(nprocs=4, backend="auto"), machine(cpus=8, gpus=2))
    assert ranks.backend == "gloo"
    assert ranks.notes == (
        "nbspawn: --backend auto uses gloo: 4 ranks and 2 GPUs visible (nccl needs a GPU of its own per rank).",
    )


def test_nccl_without_a_gpu_is_refused():
    with pytest.raises(SpawnUsageError, match="--backend nccl needs CUDA GPUs"):
        decide_ranks(Settings(nprocs=2, backend="nccl"), machine(cpus=2, gpus=0))


def test_a_kernel_that_touched_cuda_starts_forkserver_ranks_with_its_environment_now():
    blocked = machine({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, cpus=4, gpus=1, fork_blocker="CUDA is initialized")
    ranks = decide_ranks(Settings(nprocs=1), blocked)
    assert ranks.start_method == "forkserver" and "not fork: CUDA is initialized" in ranks.notes[0]
    assert ranks.kernel_env == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    with pytest.raises(SpawnUsageError, match="cannot fork: CUDA is initialized"):
        decide_ranks(Settings(nprocs=1, start_method="fork"), blocked)


def test_forked_ranks_get_one_thread_once_openmp_runs_in_the_kernel():
    started = machine(cpus=8, openmp_started=True)
    assert decide_ranks(Settings(nprocs=2, backend="gloo"), started).omp_threads == 1
    asked = machine(cpus=8, openmp_started=True, user_env={"OMP_NUM_THREADS": "4"})
    ranks = decide_ranks(Settings(nprocs=2, backend="gloo", env={"OMP_NUM_THREADS": "4"}), asked)
    assert ranks.omp_threads == 1 and "not 4" in ranks.notes[0]
    forkserver = decide_ranks(Settings(nprocs=2, backend="gloo", start_method="forkserver"), started)
    assert forkserver.omp_threads == 4  # a fresh interpreter: OpenMP's pool is not inherited


def test_the_users_omp_num_threads_stands():
    ranks = decide_ranks(Settings(nprocs=2, backend="gloo"), machine({"OMP_NUM_THREADS": "3"}, cpus=8))
    assert ranks.omp_threads is None and ranks.notes == ()


def test_a_program_starts_with_spawn_and_no_group():
    ranks = decide_ranks(
        Settings(nprocs=2), machine(cpus=4), Program(argv=("python", "train.py"), words=("train.py",), python=True)
    )
    assert (ranks.start_method, ranks.backend) == ("spawn", "none")


def test_nothing_is_asked_that_the_decision_does_not_need():
    """gloo on 2 given ranks under spawn: no GPU counted, fork's safety not asked."""
    quiet = Unasked({}, {}, Told(cpus=2, start_methods=("fork", "spawn"), openmp_started=False))
    ranks = decide_ranks(Settings(nprocs=2, backend="gloo", start_method="spawn"), quiet)
    assert (ranks.nprocs, ranks.start_method, ranks.backend, ranks.omp_threads) == (2, "spawn", "gloo", 1)


def test_too_many_ranks_are_refused_before_a_gpu_is_counted():
    small = Room(open_files=1024, open_now=40, tasks=None, tasks_now=0, memory=None)
    tight = Unasked({}, {}, Told(cpus=2, start_methods=("spawn",), room=small))
    with pytest.raises(SpawnUsageError, match="ulimit -n"):
        decide_ranks(Settings(nprocs=512, backend="auto", start_method="spawn"), tight)
    assert decide_ranks(Settings(nprocs=8, backend="gloo", start_method="spawn"), tight).nprocs == 8


def test_no_fork_on_the_platform_means_spawn():
    assert decide_ranks(Settings(nprocs=1, backend="gloo"), machine(cpus=1, start_methods=("spawn",))).start_method == "spawn"


def test_a_machine_here_probes_each_fact_once():
    here = Machine.here({"CUDA_VISIBLE_DEVICES": ""})
    assert here.gpus == 0 and here.cpus >= 1 and "fork" in here.start_methods
    assert here.visible_devices == ""  # the cell's --env over the kernel's
    assert {"gpus", "cpus", "start_methods"} <= set(vars(here))  # cached: asked once per plan


TPU_ENVS = tuple({"TPU_VISIBLE_CHIPS": str(chip), "PJRT_LOCAL_PROCESS_RANK": str(chip)} for chip in range(4))
TPU_HOST = {"xla_installed": True, "tpu_chips": 4, "xla_runtime_up": None, "tpu_plan": TpuPlan(4, TPU_ENVS, ("a note",))}


def test_auto_on_a_tpu_host_is_a_rank_per_chip_with_the_launchers_environment():
    ranks = decide_ranks(Settings(nprocs="auto"), machine(**TPU_HOST))
    assert (ranks.nprocs, ranks.accelerator_envs, ranks.unset_env) == (4, TPU_ENVS, LAUNCHER_KEYS)
    assert ranks.notes == ("a note",)


def test_a_kernel_whose_xla_runtime_is_up_is_refused_naming_the_cell():
    up = machine(**{**TPU_HOST, "xla_runtime_up": "Cell In[2], line 1: t = torch.ones(2, device=xm.xla_device())"})
    with pytest.raises(SpawnUsageError, match=r"already up in this kernel \(first at Cell In\[2\], line 1"):
        decide_ranks(Settings(nprocs="auto"), up)


def test_accelerator_tpu_without_torch_xla_is_refused_and_none_asks_nothing():
    with pytest.raises(SpawnUsageError, match="--accelerator tpu needs torch_xla"):
        decide_ranks(Settings(nprocs=2, accelerator="tpu"), machine(xla_installed=False))

    class NoTpuFacts(Machine):
        @cached_property
        def tpu_chips(self) -> int:
            raise AssertionError("counted the TPU chips")

    told = Told(**{**PLAIN_TOLD, "cpus": 2})  # type: ignore[typeddict-item]
    told.pop("tpu_chips")
    assert decide_ranks(Settings(nprocs=2, accelerator="none"), NoTpuFacts({}, {}, told)).accelerator_envs == ()
