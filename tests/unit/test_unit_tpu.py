"""TPU ranks (nbspawn._tpu, issue 31), against torch_xla's own launcher functions.

torch_xla's topology code runs without a TPU: the topology comes from ``TPU_SKIP_MDS_QUERY=1`` and the
``TPU_ACCELERATOR_TYPE``/``TPU_HOST_BOUNDS``/``TPU_CHIPS_PER_HOST_BOUNDS``/``TPU_WORKER_ID`` variables,
and the chips are counted by the one function that reads the PCI bus, ``tpu.num_available_chips``,
which is given the host's chip count here.  The reference each rank's environment is checked against
is computed in a fresh interpreter that runs torch_xla's functions as its launcher does, with no
nbspawn code in it.  The tests that need torch_xla skip without it (the main venv has none; CI's
``make runtime-tpu-cpu`` job has torch 2.9.1 + torch_xla 2.9.0).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from nbspawn import _tpu
from nbspawn._source import CellSource
from nbspawn._spec import RunSpec
from nbspawn.errors import SpawnUsageError

HAS_TORCH_XLA = _tpu.installed()
needs_torch_xla = pytest.mark.skipif(
    not HAS_TORCH_XLA, reason="torch_xla is not installed (make runtime-tpu-cpu runs these with torch_xla 2.9)"
)

# name -> (the host's variables, its chips): a one-host v4-8, a one-host v5e-8 (Kaggle's), worker 1 of a two-host v4-16
TOPOLOGIES: dict[str, tuple[dict[str, str], int]] = {
    "v4-8": (
        {"TPU_ACCELERATOR_TYPE": "v4-8", "TPU_HOST_BOUNDS": "1,1,1", "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1", "TPU_WORKER_ID": "0"},
        4,
    ),
    "v5litepod-8": (
        {
            "TPU_ACCELERATOR_TYPE": "v5litepod-8",
            "TPU_HOST_BOUNDS": "1,1,1",
            "TPU_CHIPS_PER_HOST_BOUNDS": "2,4,1",
            "TPU_WORKER_ID": "0",
        },
        8,
    ),
    "v4-16": (
        {
            "TPU_ACCELERATOR_TYPE": "v4-16",
            "TPU_HOST_BOUNDS": "1,1,2",
            "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1",
            "TPU_WORKER_ID": "1",
            "TPU_WORKER_HOSTNAMES": "host0,host1",
        },
        4,
    ),
}


def host_environ(name: str, **extra: str) -> dict[str, str]:
    variables, _chips = TOPOLOGIES[name]
    return {"PATH": os.environ.get("PATH", ""), "TPU_SKIP_MDS_QUERY": "1", **variables, **extra}


@pytest.fixture
def chips(monkeypatch):
    """Give torch_xla's chip count (its PCI scan, the one function that counts) a host's chips."""
    from torch_xla._internal import tpu

    def give(count: int) -> None:
        monkeypatch.setattr(tpu, "num_available_chips", lambda: count)

    return give


REFERENCE = textwrap.dedent(
    """
    # torch_xla's launcher, as xmp.spawn runs it (pjrt.run_multiprocess, initialize_multiprocess), in a
    # fresh process per topology; no nbspawn here
    import json, os, sys
    from torch_xla._internal import tpu
    out = {}
    for name, (environ, chips) in json.loads(sys.argv[1]).items():
        tpu.num_available_chips = lambda chips=chips: chips
        os.environ.clear(); os.environ.update(environ)
        n = tpu.num_local_processes()
        ranks = []
        for local_rank in range(n):
            os.environ.clear(); os.environ.update(environ)
            os.environ.setdefault("PJRT_LOCAL_PROCESS_RANK", str(local_rank))
            os.environ.setdefault("PJRT_LOCAL_PROCESS_COUNT", str(n))
            tpu.configure_topology(local_rank, n)
            ranks.append({k: v for k, v in os.environ.items() if environ.get(k) != v})
        out[name] = {"count": n, "ranks": ranks}
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def reference() -> dict:
    if not HAS_TORCH_XLA:
        pytest.skip("torch_xla is not installed")
    given = {name: (host_environ(name), chips) for name, (_v, chips) in TOPOLOGIES.items()}
    done = subprocess.run(
        [sys.executable, "-c", REFERENCE, json.dumps(given)], capture_output=True, text=True, timeout=300, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


@needs_torch_xla
@pytest.mark.parametrize("name", list(TOPOLOGIES))
def test_each_rank_gets_torch_xlas_environment_and_auto_is_its_process_count(name, reference, chips):
    chips(TOPOLOGIES[name][1])
    before = dict(os.environ)
    plan = _tpu.plan_tpu(host_environ(name), {}, None)
    assert dict(os.environ) == before  # the kernel's environment is untouched
    assert plan.local_processes == reference[name]["count"] == TOPOLOGIES[name][1]
    assert [dict(env) for env in plan.rank_envs] == reference[name]["ranks"]
    assert plan.notes == ()


@needs_torch_xla
def test_the_topologies_read_as_torch_xla_documents_them(chips):
    """A few values said outright, so a torch_xla that changed its arithmetic is noticed (the pin)."""
    chips(4)
    v4 = _tpu.plan_tpu(host_environ("v4-8"), {}, None).rank_envs
    assert v4[1] == {
        "PJRT_LOCAL_PROCESS_RANK": "1",
        "PJRT_LOCAL_PROCESS_COUNT": "4",
        "TPU_VISIBLE_CHIPS": "1",
        "TPU_PROCESS_BOUNDS": "2,2,1",
        "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1",
        "TPU_PROCESS_ADDRESSES": "localhost:8476,localhost:8477,localhost:8478,localhost:8479",
        "TPU_PROCESS_PORT": "8477",
        "CLOUD_TPU_TASK_ID": "1",
    }
    pod = _tpu.plan_tpu(host_environ("v4-16"), {}, None).rank_envs
    assert pod[2]["CLOUD_TPU_TASK_ID"] == "6"  # worker 1's third chip: 1 * 4 + 2
    assert pod[2]["TPU_PROCESS_BOUNDS"] == "2,2,2"
    assert pod[0]["TPU_PROCESS_ADDRESSES"].split(",")[4] == "host1:8476"
    chips(8)
    v5e = _tpu.plan_tpu(host_environ("v5litepod-8"), {}, None).rank_envs
    assert [env["TPU_VISIBLE_CHIPS"] for env in v5e] == [str(r) for r in range(8)]
    assert {env["TPU_PROCESS_BOUNDS"] for env in v5e} == {"2,4,1"}


@needs_torch_xla
@pytest.mark.parametrize("name", list(TOPOLOGIES))
def test_a_previous_launchs_variables_never_reach_the_next(name, reference, chips):
    """After xmp.spawn(nprocs=1) in the kernel, torch_xla's setdefault would keep TPU_PROCESS_BOUNDS=1,1,1
    and start one process; nbspawn computes every launch from the host's topology alone."""
    chips(TOPOLOGIES[name][1])
    stale = {
        "TPU_PROCESS_BOUNDS": "1,1,1",
        "TPU_VISIBLE_CHIPS": "0",
        "CLOUD_TPU_TASK_ID": "9",
        "TPU_PROCESS_PORT": "9999",
        "PJRT_LOCAL_PROCESS_COUNT": "1",
    }
    plan = _tpu.plan_tpu(host_environ(name, **stale), {}, None)
    assert plan.local_processes == reference[name]["count"]
    assert [dict(env) for env in plan.rank_envs] == reference[name]["ranks"]
    assert len(plan.notes) == 1 and "TPU_PROCESS_BOUNDS=1,1,1" in plan.notes[0]


@needs_torch_xla
def test_env_sets_a_launcher_variable_on_purpose(chips):
    chips(4)
    plan = _tpu.plan_tpu(host_environ("v4-8"), {"TPU_PROCESS_PORT": "9000"}, None)
    assert all("TPU_PROCESS_PORT" not in env for env in plan.rank_envs)  # the user's own (--env) stands
    assert plan.rank_envs[3]["TPU_VISIBLE_CHIPS"] == "3"


@needs_torch_xla
def test_one_rank_uses_one_chip_as_xmp_spawn_nprocs_1_and_other_counts_are_refused(chips):
    chips(4)
    (one,) = _tpu.plan_tpu(host_environ("v4-8"), {}, 1).rank_envs
    assert one == {
        "PJRT_LOCAL_PROCESS_COUNT": "1",
        "TPU_VISIBLE_CHIPS": "0",
        "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1",
        "TPU_PROCESS_BOUNDS": "1,1,1",
    }
    assert len(_tpu.plan_tpu(host_environ("v4-8"), {}, 4).rank_envs) == 4
    with pytest.raises(SpawnUsageError, match=r"-n 3 on a TPU host: .*\(4 here\)"):
        _tpu.plan_tpu(host_environ("v4-8"), {}, 3)
    chips(0)
    with pytest.raises(SpawnUsageError, match="finds no TPU chip"):
        _tpu.plan_tpu(host_environ("v4-8"), {}, None)


@needs_torch_xla
def test_auto_takes_a_tpu_host_only(chips):
    chips(4)
    assert _tpu.wants_tpu("auto", host_environ("v4-8"))
    assert _tpu.wants_tpu("tpu", host_environ("v4-8"))
    assert not _tpu.wants_tpu("auto", host_environ("v4-8", PJRT_DEVICE="CPU"))
    assert not _tpu.wants_tpu("none", host_environ("v4-8"))
    chips(0)
    assert not _tpu.wants_tpu("auto", host_environ("v4-8"))


def test_auto_asks_torch_xla_only_where_it_is_imported_or_a_tpu_is_named():
    assert not _tpu.hinted({"PATH": "/bin"}, modules={})
    assert _tpu.hinted({}, modules={"torch_xla": object()})
    assert _tpu.hinted({"PJRT_DEVICE": "TPU"}, modules={})
    assert _tpu.hinted({"TPU_ACCELERATOR_TYPE": "v5litepod-8"}, modules={})  # Kaggle's TPU VM
    assert _tpu.hinted({"COLAB_TPU_ADDR": "10.0.0.2:8470"}, modules={})


@needs_torch_xla
def test_a_kernel_whose_xla_runtime_is_up_is_refused():
    """In a fresh interpreter (the test process keeps its runtime down): refused once an XLA tensor exists."""
    code = textwrap.dedent(
        """
        import os
        os.environ["PJRT_DEVICE"] = "CPU"
        from nbspawn import _tpu
        from nbspawn.errors import SpawnUsageError
        import torch, torch_xla
        _tpu.refuse_runtime_up(_tpu.runtime_initialized())  # imported, not started: fine
        torch.ones(2, device=torch_xla.device())
        try:
            _tpu.refuse_runtime_up(_tpu.runtime_initialized(), "Cell In[2], line 1: t = torch.ones(2, device=torch_xla.device())")
        except SpawnUsageError as err:
            print("refused:", err)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert "refused: the XLA runtime is already up in this kernel (first at Cell In[2], line 1:" in done.stdout, (
        done.stdout + done.stderr
    )


@pytest.mark.skipif(HAS_TORCH_XLA, reason="torch_xla is installed here")
def test_without_torch_xla_tpu_is_refused_and_auto_is_not_a_tpu():
    with pytest.raises(SpawnUsageError, match="--accelerator tpu needs torch_xla"):
        _tpu.wants_tpu("tpu", os.environ)
    assert not _tpu.wants_tpu("auto", {"TPU_ACCELERATOR_TYPE": "v5litepod-8"})
    assert not _tpu.runtime_initialized()


def test_a_rank_drops_the_kernels_launcher_variables_it_was_not_given():
    """One-chip ranks get no TPU_PROCESS_PORT or CLOUD_TPU_TASK_ID: the kernel's (a fork inherits them) go."""
    spec = RunSpec(
        run_id="r",
        nprocs=1,
        start_method="fork",
        backend="none",
        cell=CellSource(""),
        run_dir="/nonexistent/r",
        env={"CLOUD_TPU_TASK_ID": "5"},  # --env: the user's own stays
        accelerator_envs=({"TPU_VISIBLE_CHIPS": "0", "TPU_PROCESS_BOUNDS": "1,1,1"},),
        unset_env=_tpu.LAUNCHER_KEYS,
    )
    inherited = {"TPU_PROCESS_PORT": "8477", "TPU_PROCESS_BOUNDS": "2,2,1", "CLOUD_TPU_TASK_ID": "1", "HOME": "/h"}
    spec.apply_env(0, inherited)
    assert inherited["TPU_PROCESS_BOUNDS"] == "1,1,1" and inherited["TPU_VISIBLE_CHIPS"] == "0"
    assert "TPU_PROCESS_PORT" not in inherited
    assert inherited["CLOUD_TPU_TASK_ID"] == "5" and inherited["HOME"] == "/h" and inherited["RANK"] == "0"
    plain = RunSpec(run_id="r", nprocs=1, start_method="fork", backend="none", cell=CellSource(""), run_dir="/x/r")
    kept = {"TPU_PROCESS_PORT": "8477"}
    plain.apply_env(0, kept)  # not a TPU run: the kernel's variables are none of nbspawn's business
    assert kept["TPU_PROCESS_PORT"] == "8477"


def test_the_refusal_names_the_line_that_started_the_runtime():
    source = "import torch\n# xm.xla_device() later\nt = torch.ones(2, device=xm.xla_device())\n"
    assert _tpu.culprit_line("Cell In[3]", source) == "Cell In[3], line 3: t = torch.ones(2, device=xm.xla_device())"
    assert _tpu.culprit_line("Cell In[4]", "x = 1\n") == "Cell In[4]"
