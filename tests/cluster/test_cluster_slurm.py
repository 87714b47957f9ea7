"""The guide's Slurm recipe, run for real (issue #45): Debian's ``slurmctld`` on this machine and a
``slurmd`` on each of two nodes (network namespaces with their own address, hostname, ~/.ipython and
/tmp: tests/cluster/slurm_nodes.py), a kernel here that starts an ipyparallel cluster whose engines
are one Slurm job, one engine per node, and ``%%spawn --cluster`` across them with gloo between the
nodes: a cell, a kept world, a program, a failing rank, a stopped background run, the job cancelled
mid-cell, and a job that waits in the queue.

Needs root (namespaces) and Slurm with munge: in CI the fixture installs Debian's ``slurm-wlm`` and
``munge`` when they are missing; elsewhere the tests are skipped, saying why.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import threading
import time

import pytest
from cluster_nodes import netns_skip_reason
from kernel_harness import load_nbspawn, ok, run, start_kernel, stop_kernel
from slurm_nodes import SlurmNodes, slurm_skip_reason
from test_cluster_recipes import GLOO_ACROSS_THE_NODES, _install, _left_on

# alone: slurmctld, two slurmd and a cluster on 2 cores would slow the timed cluster tests beside them
pytestmark = [pytest.mark.timeout(300), pytest.mark.alone]


@pytest.fixture(scope="module")
def slurm_nodes():
    reason = netns_skip_reason()
    if reason:
        pytest.skip(reason)
    _install("slurm-wlm munge openssh-server", slurm_skip_reason() is not None)
    reason = slurm_skip_reason()
    if reason:
        pytest.skip(reason)
    with SlurmNodes(nodes=2) as nodes:
        yield nodes


# the guide's recipe, with the address the nodes reach this machine at
RECIPE = """
import ipyparallel as ipp
{name} = ipp.Cluster(n=2, engines="slurm", controller_ip={address!r})
{name}.config.SlurmEngineSetLauncher.batch_template = '''#!/bin/sh
#SBATCH --export=ALL --job-name=ipengine-{{cluster_id}}
#SBATCH --nodes={{n}} --ntasks-per-node=1
srun {{program_and_args}}
'''
"""


@pytest.fixture(scope="module")
def kernel(slurm_nodes):
    """A kernel in this machine's own namespace, a Slurm client (``SLURM_CONF``), that ran the guide's
    Slurm recipe: ``rc``, ``cluster``."""
    # Slurm clusters share home directories: the connection files are where every node reads them
    ipython_dir = tempfile.mkdtemp(prefix="nbspawn-ipython-", dir="/var/tmp")
    # its working directory is where ipyparallel writes the batch script, and Slurm the job's output
    k = load_nbspawn(start_kernel(cwd=ipython_dir, env={"IPYTHONDIR": ipython_dir, **slurm_nodes.env}))
    try:
        out = ok(
            k,
            RECIPE.format(name="cluster", address=slurm_nodes.root_address)
            + "rc = cluster.start_and_connect_sync()\nprint(sorted(rc[:].apply_sync(__import__('socket').gethostname)))",
            timeout=180,
        ).stdout
        assert "['node0', 'node1']" in out, out  # one engine per node
        yield k
        ok(k, "cluster.stop_cluster_sync()", timeout=60)
        assert _left_on(slurm_nodes, exclude=("sshd", "slurmd")) == [], _left_on(slurm_nodes, exclude=("sshd", "slurmd"))
    finally:
        stop_kernel(k)
        shutil.rmtree(ipython_dir, ignore_errors=True)


def _hosts_by_rank(out: str, said: str) -> dict[int, str]:
    """``[rankR]: HOST <said>`` lines: which node each rank ran on (Slurm starts the engines together,
    so which node registers first, and is node 0, is the engines' race)."""
    return {int(r): host for r, host in re.findall(rf"\[rank(\d)\]: (node\d) {said}", out)}


def test_a_cell_runs_across_the_slurm_nodes_with_gloo_between_them(kernel):
    out = ok(kernel, GLOO_ACROSS_THE_NODES, timeout=120).stdout
    hosts = {int(r): host for r, host, rr in re.findall(r"\[rank(\d)\]: (node\d) rank (\d) sum 2.0", out) if r == rr}
    assert sorted(hosts) == [0, 1] and sorted(hosts.values()) == ["node0", "node1"], out
    assert f"node 0 ({hosts[0]})" in out and f"node 1 ({hosts[1]})" in out, out  # the node line names the hosts


def test_a_failing_rank_is_named_with_its_slurm_node(kernel):
    failed = run(
        kernel,
        "%%spawn --cluster rc -n 1\nimport os\nif os.environ['RANK'] == '1':\n    raise ValueError('bad shard')",
        timeout=120,
    )
    assert re.search(r"rank 1 on node 1 \(node\d\)", failed.error_text) and "ValueError: bad shard" in failed.error_text, (
        failed.error_text
    )


def test_a_kept_world_a_program_and_a_stopped_background_run_on_the_slurm_nodes(kernel, slurm_nodes):
    ok(
        kernel,
        "%%spawn --cluster rc -n 1 --world slw\nimport torch.distributed as dist\ndist.init_process_group('gloo')\nseen = dist.get_rank() * 10",
        timeout=120,
    )
    out = ok(kernel, "%%spawn --world slw\nimport socket\nprint(socket.gethostname(), seen)", timeout=120).stdout
    hosts = _hosts_by_rank(out, "0") | _hosts_by_rank(out, "10")
    assert f"[rank0]: {hosts[0]} 0" in out and f"[rank1]: {hosts[1]} 10" in out and len(set(hosts.values())) == 2, out
    ok(kernel, "%spawn stop slw", timeout=60)
    program = slurm_nodes.tmpdir / "train.py"  # where every node sees it (a node's /tmp is its own)
    program.write_text("import os, socket\nprint('program on', socket.gethostname(), 'rank', os.environ['RANK'])\n")
    out = ok(kernel, f"%spawn --cluster rc -n 1 -- {program}", timeout=120).stdout
    on = dict(re.findall(r"program on (node\d) rank (\d)", out))
    assert sorted(on) == ["node0", "node1"] and sorted(on.values()) == ["0", "1"], out
    ok(kernel, "%%spawn --cluster rc -n 1 --bg\nimport time\nprint('started', flush=True)\ntime.sleep(300)", timeout=120)
    said = ok(kernel, "import time; time.sleep(2)\n%spawn stop", timeout=120).stdout
    assert "stopped" in said, said
    left = [" ".join(p.cmdline()) for p in slurm_nodes.processes() if "nbspawn rank" in " ".join(p.cmdline())]
    assert left == [], left


def _in_background(kernel, cell: str) -> tuple[threading.Thread, dict]:
    """Run ``cell`` in a thread of the test's: its result lands in the dict's ``"result"``."""
    box: dict = {}
    thread = threading.Thread(target=lambda: box.setdefault("result", run(kernel, cell, timeout=180)), daemon=True)
    thread.start()
    return thread, box


def _until(what, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while not (seen := what()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)
    return seen


def test_a_queued_job_is_shown_pending_with_slurms_reason_and_the_cell_can_be_stopped_or_wait(kernel, slurm_nodes):
    # the module's cluster holds a core of each node's two, another job the other: a second cluster's
    # engines wait in the queue
    blocker = slurm_nodes.sbatch("-N2", "--ntasks-per-node=1", "--wrap", "sleep 600")
    try:
        _until(lambda: slurm_nodes.job_state(blocker).startswith("RUNNING"))
        ok(kernel, RECIPE.format(name="queued", address=slurm_nodes.root_address) + "queued.start_cluster_sync()", timeout=120)
        job = ok(kernel, "print(next(iter(queued.engines.values())).job_id)").stdout.strip()
        _until(lambda: slurm_nodes.job_state(job).startswith("PENDING"))
        cell = "%%spawn --cluster queued -n 1\nimport socket\nprint('ran on', socket.gethostname())"
        # interrupted while it waits: one line, nothing started
        thread, box = _in_background(kernel, cell)
        time.sleep(4)
        kernel.manager.interrupt_kernel()
        thread.join(60)
        waited = box["result"]
        pending = rf"Slurm job {job} is PENDING \((Resources|Priority)\)"
        assert re.search(rf"nbspawn: waiting for the engines of queued \(0 of 2 registered\): {pending}", waited.stdout), (
            waited.stdout
        )
        said = waited.stderr + waited.error.evalue + waited.error_text
        assert re.search(
            rf"interrupted while waiting for its engines \(0 of 2 registered; {pending}\); nothing was started", said
        ), said
        assert "Traceback" not in said and len(waited.error_text.strip().splitlines()) <= 1, said  # one line
        # waiting until the nodes are free, then running
        thread, box = _in_background(kernel, cell)
        time.sleep(3)
        slurm_nodes.scancel(blocker)
        thread.join(120)
        ran = box["result"]
        assert ran.status == "ok", ran.error_text
        assert re.search(pending, ran.stdout), ran.stdout
        assert sorted(re.findall(r"ran on (node\d)", ran.stdout)) == ["node0", "node1"], ran.stdout
    finally:
        slurm_nodes.scancel(blocker)
        run(kernel, "queued.stop_cluster_sync()", timeout=60)


def test_scancel_mid_cell_ends_the_run_naming_the_lost_node_and_leaves_nothing(kernel, slurm_nodes):
    """(last: it ends the module's cluster)"""
    job = ok(kernel, "print(next(iter(cluster.engines.values())).job_id)").stdout.strip()
    thread, box = _in_background(kernel, "%%spawn --cluster rc -n 1\nimport time\nprint('started', flush=True)\ntime.sleep(120)")
    _until(lambda: len([p for p in slurm_nodes.processes() if "nbspawn rank" in " ".join(p.cmdline())]) == 2)
    slurm_nodes.scancel(job)
    thread.join(60)
    text = box["result"].error_text
    assert re.search(rf"node \d \(node\d\) was lost: its Slurm job {job} was CANCELLED", text), text
    assert "killed by SIGTERM" not in text, text  # Slurm's signal, told as Slurm's, not as a peer's stop
    assert _left_on(slurm_nodes, exclude=("sshd", "slurmd")) == [], _left_on(slurm_nodes, exclude=("sshd", "slurmd"))
