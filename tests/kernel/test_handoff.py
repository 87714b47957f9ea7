"""--share and --out through a real kernel, with forked ranks and ranks that do not inherit the kernel, and
what they leave behind.  Those are forkserver ranks: a spawned rank takes the same path (its names and
tensors pickled through torch's reductions, received by the rank itself: ranks/_cell.py), and Python's
fresh interpreter, what spawn adds, is tested where it is the subject (test_shm, test_spawn_core)."""

from __future__ import annotations

import time

import pytest
from kernel_harness import (
    converse,
    execute,
    ok,
)

pytestmark = pytest.mark.timeout(240)
METHODS = ["fork", "forkserver"]


def fail(kernel, code: str, timeout: float = 120):
    result = execute(kernel.client, code, timeout=timeout)
    assert result.status == "error", result.stdout
    return result.stderr + result.error_text


@pytest.mark.parametrize("method", METHODS)
def test_ranks_write_slices_of_one_shared_kernel_tensor_in_place(kernel, method):
    ok(kernel, "import torch\ncanvas = torch.zeros(4, 1000)\nview = canvas[1:]\noriginal = canvas")
    ok(
        kernel,
        f"%%spawn -n 4 --start-method {method} --share canvas\nimport os\nr = int(os.environ['RANK'])\ncanvas[r].fill_(r + 1)",
    )
    # the same tensor object, and views of it, now show the ranks' writes
    assert ok(kernel, "print(canvas[:, 0].tolist(), canvas.sum().item(), canvas is original, view[0, 0].item())").stdout == (
        "[1.0, 2.0, 3.0, 4.0] 10000.0 True 2.0\n"
    )


@pytest.mark.parametrize("method", METHODS)
def test_tensors_not_shared_reach_the_ranks_but_their_writes_stay_there(kernel, method):
    ok(kernel, "import torch\ndata = torch.arange(10.0)")
    result = ok(
        kernel, f"%%spawn -n 2 --start-method {method}\nprint(data.sum().item())\ndata.add_(100)\nprint(data.sum().item())"
    )
    for r in range(2):  # each rank's lines in its order; the two ranks' lines may interleave
        lines = [line.removeprefix(f"[rank{r}]: ") for line in result.stdout.splitlines() if line.startswith(f"[rank{r}]: ")]
        assert lines == ["45.0", "1045.0"], result.stdout
    assert ok(kernel, "print(data.sum().item())").stdout == "45.0\n"


@pytest.mark.parametrize("method", METHODS)
def test_out_binds_each_ranks_values_in_the_kernel_as_a_list(kernel, method):
    code = (
        f"%%spawn -n 3 --start-method {method} --out result,label\n"
        "import os, torch\nr = int(os.environ['RANK'])\n"
        "result = torch.full((1000,), float(r))\nlabel = {'rank': r}\n"
    )
    ok(kernel, code)
    check = "print([t[0].item() for t in result], [t.shape[0] for t in result], label, nbspawn.last_run().outputs['label'] is not None)"
    assert (
        ok(kernel, "import nbspawn\n" + check).stdout
        == "[0.0, 1.0, 2.0] [1000, 1000, 1000] [{'rank': 0}, {'rank': 1}, {'rank': 2}] True\n"
    )


@pytest.mark.parametrize("method", METHODS)
def test_a_shared_module_and_container_are_the_kernels_own_memory(kernel, method):
    ok(kernel, "import torch\nnet = torch.nn.Linear(3, 2)\nstate = {'w': torch.zeros(5), 'steps': [torch.zeros(1)]}")
    code = (
        f"%%spawn -n 2 --start-method {method} --share net,state\n"
        "import os, torch\n"
        "if os.environ['RANK'] == '0':\n"
        "    with torch.no_grad():\n"
        "        net.weight.fill_(7.0)\n"
        "    state['w'].fill_(3.0)\n"
        "    state['steps'][0] += 1\n"
    )
    ok(kernel, code)
    assert (
        ok(kernel, "print(net.weight.sum().item(), state['w'].sum().item(), state['steps'][0].item())").stdout
        == "42.0 15.0 1.0\n"
    )


def test_sharing_an_already_shared_tensor_copies_nothing(kernel):
    ok(kernel, "import torch\nbig = torch.ones(1 << 22)")
    ok(kernel, "%%spawn -n 2 --start-method forkserver --share big\nbig[0] += 1")
    ok(kernel, "first = (big.data_ptr(), big.untyped_storage()._get_shared_fd())")
    for _ in range(2):
        ok(kernel, "%%spawn -n 2 --start-method forkserver --share big\nbig[1] += 1")
    assert ok(kernel, "print((big.data_ptr(), big.untyped_storage()._get_shared_fd()) == first, big[:2].tolist())").stdout == (
        "True [3.0, 5.0]\n"
    )


def test_a_large_hand_off_both_ways_does_not_deadlock(kernel):
    ok(kernel, "import torch\nweights = torch.zeros(1 << 26)")  # 256 MiB
    code = (
        "%%spawn -n 2 --start-method forkserver --share weights --out chunk\n"
        "import os, torch\nr = int(os.environ['RANK'])\n"
        "weights[r::2] = r + 1\nchunk = torch.full((1 << 25,), float(r))\n"  # 128 MiB back from each rank
    )
    ok(kernel, code, timeout=200)
    assert ok(kernel, "print(weights[:4].tolist(), [c.sum().item() for c in chunk])").stdout == (
        f"[1.0, 2.0, 1.0, 2.0] [0.0, {float(1 << 25)}]\n"
    )
    ok(kernel, "del weights, chunk")


def test_a_name_missing_on_some_rank_is_reported_with_the_rank(kernel):
    said = fail(kernel, "%%spawn -n 3 --out answer\nimport os\nif os.environ['RANK'] != '2':\n    answer = 42")
    assert "SpawnOutputError: --out 'answer' is not defined on rank 2" in said
    assert ok(kernel, "print('answer' in globals())").stdout == "False\n"


@pytest.mark.parametrize(
    ("setup", "options", "message"),
    [
        ("", "--share nowhere", "--share: 'nowhere' is not defined in the kernel"),
        ("plain = 5", "--share plain", "--share: 'plain' is a builtins.int; --share takes a tensor"),
        ("import torch\nmixed = {'t': torch.ones(2), 'n': 3}", "--share mixed", "--share: 'mixed' is a builtins.dict"),
        ("", "--out 2fast", "--out: '2fast' is not a Python name"),
    ],
)
def test_bad_hand_off_input_is_refused_before_any_rank_starts(kernel, setup, options, message):
    ok(kernel, (setup + "\n" if setup else "") + "import nbspawn\nbefore = nbspawn.last_run()")
    said = fail(kernel, f"%%spawn -n 2 {options}\nprint('should not run')")
    assert message in said and "Traceback" not in said
    assert ok(kernel, "print(nbspawn.last_run() is before)").stdout == "True\n"


# -- what a run holds once it is over (issue 25) --------------------------------------------------


def test_the_last_run_does_not_pin_the_tensors_its_cell_used(kernel):
    """nbspawn.last_run() keeps the run's spec, whose payload held every object the cell used: after
    `del t` the tensor (on a GPU box its memory, or the CPU copy made for the ranks) stayed allocated.
    The payload lets go once the ranks have it (item 5)."""
    ok(kernel, "import gc, weakref, torch\nt = torch.ones(1000)\nkept = weakref.ref(t)")
    ok(kernel, "%%spawn -n 2 --start-method forkserver\nprint(t.sum().item())")
    assert ok(
        kernel, "import nbspawn\nassert nbspawn.last_run() is not None\ndel t\ngc.collect()\nprint(kept() is None)"
    ).stdout == ("True\n")


@pytest.mark.parametrize("fails", [False, True])
def test_a_forkserver_rank_drops_what_it_received_before_it_leaves(kernel, tmp_path, fails):
    """A forkserver rank leaves through os._exit, with no interpreter shutdown: whatever it still
    holds is never freed, and a CUDA IPC block stays in the kernel's limbo (torch decrements its ref
    counter only in the storage's deleter).  So the rank drops what it received before it leaves,
    whether its cell succeeded or failed: the finalizer of the tensor it received runs (item 4)."""
    freed = tmp_path / "freed"
    ok(kernel, "import torch\nreceived_by_rank = torch.ones(1000)")
    code = (
        "%%spawn -n 1 --start-method forkserver\nimport weakref\n"
        f"weakref.finalize(received_by_rank, open, {str(freed)!r}, 'w')\n"
        + ("raise ValueError('the cell failed')\n" if fails else "")
    )
    result = execute(kernel.client, code, timeout=120)
    assert result.status == ("error" if fails else "ok"), result.error_text
    assert freed.exists()


def test_a_rank_stopped_by_a_peers_failure_drops_what_it_received_too(kernel, tmp_path):
    """The commonest failure: rank 1 raises while rank 0 waits, and rank 0 is stopped by SIGTERM.  It
    dropped nothing before it died: on a GPU box its CUDA IPC reference was never given back and the
    kernel's --share memory stayed allocated until a restart.  Now a stopped rank drops what it
    received first (and the kernel releases for it what it could not: test_unit_ipc) (issue 41, C1)."""
    ok(kernel, "import torch\nreceived_by_ranks = torch.ones(1000)")
    # rank 1 fails only once rank 0 has its finalizer: on a loaded machine (CI's parallel tests) rank 0
    # was once stopped before it got that far, and there was nothing to see it drop
    ready = f"{tmp_path}-rank0-waits"
    code = (
        "%%spawn -n 2 --start-method forkserver\nimport os, time, weakref\n"
        f"weakref.finalize(received_by_ranks, open, os.path.join({str(tmp_path)!r}, 'freed-' + os.environ['RANK']), 'w')\n"
        "if os.environ['RANK'] == '1':\n"
        f"    while not os.path.exists({ready!r}):\n        time.sleep(0.01)\n"
        "    raise ValueError('rank 1 failed')\n"
        f"open({ready!r}, 'w').close()\ntime.sleep(60)\n"
    )
    result = execute(kernel.client, code, timeout=120)
    assert result.status == "error", result.stdout
    assert ok(kernel, "import nbspawn\nprint([r.status for r in nbspawn.last_run().ranks])").stdout == "['stopped', 'failed']\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["freed-0", "freed-1"]


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_a_stopped_world_frees_what_its_own_objects_hold(kernel, tmp_path, method):
    """%spawn stop: fork and forkserver ranks leave through os._exit, where nothing is freed; what a
    world-owned object held of the kernel's (a DDP model, an optimizer over --share parameters) was
    never given back.  The ranks let go of their namespace before they leave (issue 41, C2)."""
    world = f"own{method}{time.monotonic_ns() % 10**8}"
    freed = tmp_path / "freed"
    ok(kernel, "import torch\ng = torch.ones(1000)")
    try:
        ok(
            kernel,
            f"%%spawn --world {world} -n 1 --start-method {method} --share g\nimport weakref\n"
            f"holder = [g * 1, g]\nweakref.finalize(g, open, {str(freed)!r}, 'w')",
        )
        assert not freed.exists()  # the world's own list holds it
    finally:
        ok(kernel, f"%spawn stop {world}")
    assert freed.exists()


def test_a_kept_failure_does_not_hold_what_share_sent(kernel, tmp_path):
    """A world rank keeps its last failure for %spawn debug, frames and all: `step(g)` raising kept `x`,
    the kernel's --share tensor, for the world's life (on a GPU, its memory could not be freed on
    `del g`).  Such a failure keeps only why it cannot be debugged; --share names are dropped after a
    CPU cell too (issue 41, C3 and M8)."""
    world = f"pin{time.monotonic_ns() % 10**8}"
    freed = tmp_path / "freed"
    ok(kernel, "import torch\ng = torch.zeros(1000)")
    try:
        ok(kernel, f"%%spawn --world {world} -n 1 --start-method forkserver\nimport gc, weakref")
        failed = execute(
            kernel.client,
            f"%%spawn --world {world} --share g\nweakref.finalize(g, open, {str(freed)!r}, 'w')\n"
            "def step(x):\n    raise ValueError('in step')\nstep(g)",
        )
        assert failed.status == "error"
        ok(kernel, f"%%spawn --world {world}\ngc.collect()\nprint('g' in globals())")
        assert freed.exists()
        talk = converse(kernel, f"%spawn debug {world}", [])  # no debugger opens: it says why
        assert "cannot be debugged" in talk.text and "(x in step())" in talk.text, talk.text
    finally:
        ok(kernel, f"%spawn stop {world}")


def test_a_world_rank_drops_a_cpu_share_after_the_cell(kernel):
    """M8: a rank that never used CUDA kept every --share name bound (and its memory mapped)."""
    world = f"cpu{time.monotonic_ns() % 10**8}"
    ok(kernel, "import torch\ng = torch.zeros(1000)")
    try:
        ok(kernel, f"%%spawn --world {world} -n 1 --start-method forkserver --share g\ng.add_(1)")
        assert ok(kernel, f"%%spawn --world {world}\nprint('g' in globals())").stdout.strip().endswith("False")
    finally:
        ok(kernel, f"%spawn stop {world}")


def _maps_inode(pid: int, inode: int) -> bool:
    """Whether process ``pid`` has a mapping of the file with this inode (a memfd: shared memory)."""
    with open(f"/proc/{pid}/maps") as fh:
        return any(len(fields) >= 5 and fields[4] == str(inode) for fields in (line.split() for line in fh))


def test_a_world_rank_holds_nothing_of_a_cell_once_it_is_over(kernel):
    """Between cells a world's rank holds only its namespace: not the cell's job, nor the payload it
    opened (both held the kernel's --share tensor until the next cell came).  Seen from outside: once
    the cell dropped the name, the rank no longer maps the tensor's shared memory (item 4)."""
    world = f"held{time.monotonic_ns() % 10**8}"
    ok(kernel, "import os, torch\ng = torch.zeros(1 << 16)")
    try:
        first = ok(kernel, f"%%spawn --world {world} -n 1 --start-method forkserver\nimport os\nprint('pid', os.getpid())")
        pid = int(first.stdout.split("pid")[-1])
        ok(kernel, f"%%spawn --world {world} --share g\ng.add_(1)\ndel g")
        inode = int(ok(kernel, "print(os.fstat(g.untyped_storage()._get_shared_fd()).st_ino)").stdout)
        assert ok(kernel, "print(g[0].item())").stdout == "1.0\n"  # the rank's write reached the kernel
        assert not _maps_inode(pid, inode)
    finally:
        ok(kernel, f"%spawn stop {world}")


def test_a_world_ranks_kept_failure_holds_nothing_of_what_the_kernel_sent(kernel):
    """A failed cell's exception is kept for %spawn debug, with its traceback and the frames in it:
    none of them may hold what the kernel sent (item 4; a loop variable in the rank's frame did)."""
    world = f"dropf{time.monotonic_ns() % 10**8}"
    ok(kernel, "import torch\ng = torch.zeros(1000)")
    try:
        ok(kernel, f"%%spawn --world {world} -n 1 --start-method forkserver\nimport gc, weakref")
        failed = execute(
            kernel.client, f"%%spawn --world {world} --share g\nref = weakref.ref(g)\ndel g\nraise ValueError('after')"
        )
        assert failed.status == "error"
        result = ok(kernel, f"%%spawn --world {world}\ngc.collect()\nprint(ref() is None)")
        assert result.stdout.strip().endswith("True"), result.stdout
    finally:
        ok(kernel, f"%spawn stop {world}")


def test_a_forkserver_rank_sees_the_kernels_environment_as_it_is_now(fresh_kernel):
    """The fork server keeps the environment the kernel had when it started; a variable set (or
    removed) in the notebook since must reach the ranks as it reaches spawned and forked ones:
    CUDA_VISIBLE_DEVICES, NCCL_*, PYTORCH_CUDA_ALLOC_CONF (item 7).  Fresh ranks and a world's."""
    kernel = fresh_kernel
    ok(kernel, "import os\nos.environ['NBSPAWN_EARLY'] = 'early'")
    ok(kernel, "%%spawn -n 1 --start-method forkserver\npass")  # the fork server runs from here on, with EARLY
    ok(kernel, "os.environ['NBSPAWN_LATE'] = 'set later'\ndel os.environ['NBSPAWN_EARLY']")
    show = "import os\nprint(os.environ.get('NBSPAWN_LATE'), os.environ.get('NBSPAWN_EARLY'), os.environ['RANK'])"
    fresh = ok(kernel, f"%%spawn -n 2 --start-method forkserver\n{show}")
    assert "[rank1]: set later None 1" in fresh.stdout, fresh.stdout
    world = ok(kernel, f"%%spawn --world envw -n 1 --start-method forkserver\n{show}")
    assert "[rank0]: set later None 0" in world.stdout, world.stdout
    ok(kernel, "%spawn stop envw")


def test_the_error_record_is_written_before_what_the_rank_received_is_freed(kernel):
    """Freeing what a rank received can take the process down (on a GPU box: CUDA IPC storages on a
    broken context, std::terminate).  The rank's error record is written first, so the real traceback
    is what the kernel shows (issue 25, item 8); here the object a rank frees aborts it itself."""
    ok(
        kernel,
        "import os\nKERNEL = os.getpid()\n"
        "class AbortsWhenFreedInARank:\n    def __del__(self):\n        if os.getpid() != KERNEL:\n            os.abort()\n"
        "bomb = AbortsWhenFreedInARank()",
    )
    said = fail(kernel, "%%spawn -n 1 --start-method forkserver\nprint(type(bomb).__name__)\nraise ValueError('the real error')")
    assert "ValueError: the real error" in said, said
    ok(kernel, "del bomb")


def test_a_forkserver_rank_logs_as_the_kernels_torch_logs_says_now(fresh_kernel):
    """torch reads TORCH_LOGS (and TORCH_DISTRIBUTED_DEBUG) once, at its import, which the fork server
    did with the kernel's environment of its start: a TORCH_LOGS set in the notebook since must still
    reach a forkserver rank's loggers, as it reaches a spawned one's (issue 41, M10)."""
    kernel = fresh_kernel
    ok(kernel, "%%spawn -n 1 --start-method forkserver\npass")  # the fork server runs from here on, without TORCH_LOGS
    ok(kernel, "import os\nos.environ['TORCH_LOGS'] = '+dynamo'\nos.environ['TORCH_DISTRIBUTED_DEBUG'] = 'DETAIL'")
    show = (
        "import logging, torch.distributed as dist\n"
        "print('levels', logging.getLogger('torch._dynamo').getEffectiveLevel(), dist.get_debug_level())"
    )
    fresh = ok(kernel, f"%%spawn -n 1 --start-method forkserver\n{show}")
    assert "levels 10 DebugLevel.DETAIL" in fresh.stdout, fresh.stdout
    world = ok(kernel, f"%%spawn --world logw -n 1 --start-method forkserver\n{show}")
    assert "levels 10 DebugLevel.DETAIL" in world.stdout, world.stdout
    ok(kernel, "%spawn stop logw")
    ok(kernel, "del os.environ['TORCH_LOGS'], os.environ['TORCH_DISTRIBUTED_DEBUG']")
    fresh = ok(kernel, f"%%spawn -n 1 --start-method forkserver\n{show}")
    assert "levels 30 DebugLevel.OFF" in fresh.stdout, fresh.stdout  # as the fork server has them: nothing to redo
