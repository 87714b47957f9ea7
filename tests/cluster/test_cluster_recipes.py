"""The guide's SSH and MPI recipes, run for real (issue #45): a kernel on this machine starts an
ipyparallel cluster whose engines it launches on two nodes (network namespaces with their own
address, hostname, sshd, ~/.ipython and /tmp: tests/cluster/ssh_nodes.py), over SSH or with Open
MPI's ``mpiexec`` (which reaches the nodes over that SSH), and ``%%spawn --cluster`` runs cells, a
kept world, a program and a background run across them, with gloo between the nodes.

Needs root (namespaces), OpenSSH's server and Open MPI: in CI the fixtures install Debian's
``openssh-server`` and ``openmpi-bin`` when they are missing; elsewhere a test is skipped, saying why.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time

import pytest
from cluster_nodes import netns_skip_reason
from kernel_harness import load_nbspawn, ok, run, start_kernel, stop_kernel
from ssh_nodes import SshNodes, ssh_skip_reason

# alone: two clusters, sshd and mpiexec on 2 cores would slow the timed cluster tests beside them (an
# engine's first task past netns_nodes_interrupt's 15 s, once)
pytestmark = [pytest.mark.timeout(300), pytest.mark.alone]


def _install(packages: str, missing: bool) -> None:
    """CI (root, Debian) installs what a recipe needs, as it installs Chromium; nowhere else."""
    if missing and os.environ.get("CI") and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, check=True)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages.split()],
            env=env,
            capture_output=True,
            check=True,
        )


# a cell on one rank per node, gloo between them: each rank says where it ran and what the sum came to
GLOO_ACROSS_THE_NODES = (
    "%%spawn --cluster rc -n 1\nimport socket, torch, torch.distributed as dist\ndist.init_process_group('gloo')\n"
    "t = torch.tensor([1.0]); dist.all_reduce(t)\nprint(socket.gethostname(), 'rank', dist.get_rank(), 'sum', t.item())"
)


def _left_on(nodes: SshNodes, within: float = 10, exclude: tuple[str, ...] = ("sshd",)) -> list[str]:
    """What runs on the nodes besides their daemons (``exclude``), once it has had ``within`` seconds
    to go: an engine's nanny outlives its engine by up to 3 s (its last word to the controller)."""
    deadline = time.monotonic() + within
    while True:
        left = [" ".join(p.cmdline()) for p in nodes.processes() if p.name() not in exclude]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


@pytest.fixture(scope="module")
def ssh_nodes():
    reason = netns_skip_reason()
    if reason:
        pytest.skip(reason)
    _install("openssh-server", ssh_skip_reason() is not None)
    reason = ssh_skip_reason()
    if reason:
        pytest.skip(reason)
    with SshNodes(nodes=2) as nodes:
        yield nodes


@pytest.fixture(scope="module")
def kernel(ssh_nodes):
    """A kernel in this machine's own namespace that ran the guide's SSH recipe: ``rc``, ``cluster``."""
    ipython_dir = tempfile.mkdtemp(prefix="nbspawn-ipython-")  # the cluster's files, not ~/.ipython's
    k = load_nbspawn(start_kernel(env={"IPYTHONDIR": ipython_dir}))
    try:
        a, b = ssh_nodes.addresses
        # the guide's recipe; the node's addresses are their names, and the ssh options are those a
        # user's ~/.ssh/config has for their cluster (ssh_nodes.py)
        ok(
            k,
            f"""
import ipyparallel as ipp, sys
cluster = ipp.Cluster(engines="ssh", controller_ip={ssh_nodes.root_address!r})
cluster.config.SSHEngineSetLauncher.engines = {{{a!r}: 1, {b!r}: 1}}
cluster.config.SSHLauncher.remote_python = sys.executable
cluster.config.SSHLauncher.ssh_args = cluster.config.SSHLauncher.scp_args = ["-F", {ssh_nodes.ssh_config!r}]
rc = cluster.start_and_connect_sync()
print(sorted(rc[:].apply_sync(__import__("socket").gethostname)))
""",
            timeout=180,
        )
        yield k
        ok(k, "cluster.stop_cluster_sync()", timeout=60)
        assert _left_on(ssh_nodes) == [], f"left on the nodes after the cluster stopped: {_left_on(ssh_nodes)}"
    finally:
        stop_kernel(k)
        shutil.rmtree(ipython_dir, ignore_errors=True)


def test_a_cell_runs_across_the_ssh_nodes_with_gloo_between_them(kernel):
    out = ok(
        kernel,
        GLOO_ACROSS_THE_NODES,
        timeout=120,
    ).stdout
    assert "[rank0]: node0 rank 0 sum 2.0" in out and "[rank1]: node1 rank 1 sum 2.0" in out, out
    assert "node 0 (node0)" in out and "node 1 (node1)" in out, out  # the node line names the hosts


def test_a_failing_rank_is_named_with_its_node(kernel):
    failed = run(
        kernel,
        "%%spawn --cluster rc -n 1\nimport os\nif os.environ['RANK'] == '1':\n    raise ValueError('bad shard')",
        timeout=120,
    )
    text = failed.error_text
    assert "rank 1 on node 1 (node1)" in text and "ValueError: bad shard" in text, text


def test_a_kept_world_lives_across_cells_on_the_ssh_nodes(kernel):
    ok(
        kernel,
        "%%spawn --cluster rc -n 1 --world sshw\nimport torch.distributed as dist\ndist.init_process_group('gloo')\nseen = dist.get_rank() * 10",
        timeout=120,
    )
    out = ok(kernel, "%%spawn --world sshw\nimport socket\nprint(socket.gethostname(), seen)", timeout=120).stdout
    assert "[rank0]: node0 0" in out and "[rank1]: node1 10" in out, out
    ok(kernel, "%spawn stop sshw", timeout=60)


def test_a_program_and_a_stopped_background_run_on_the_ssh_nodes(kernel, ssh_nodes):
    # where every node sees it: a node's own /tmp is not this machine's
    program = ssh_nodes.tmpdir / "train.py"
    program.write_text("import os, socket\nprint('program on', socket.gethostname(), 'rank', os.environ['RANK'])\n")
    out = ok(kernel, f"%spawn --cluster rc -n 1 -- {program}", timeout=120).stdout
    assert "[rank0]: program on node0 rank 0" in out and "[rank1]: program on node1 rank 1" in out, out
    ok(kernel, "%%spawn --cluster rc -n 1 --bg\nimport time\nprint('started', flush=True)\ntime.sleep(300)", timeout=120)
    said = ok(kernel, "import time; time.sleep(2)\n%spawn stop", timeout=120).stdout
    assert "stopped" in said, said
    left = [" ".join(p.cmdline()) for p in ssh_nodes.processes() if "nbspawn rank" in " ".join(p.cmdline())]
    assert left == [], left  # (each engine keeps nbspawn's watcher, as a kernel does)


# -- MPI ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mpi_kernel(ssh_nodes):
    """A kernel that ran the guide's MPI recipe over the nodes' SSH: ``rc``, ``mpi_cluster``."""
    _install("openmpi-bin", shutil.which("mpiexec") is None)
    if shutil.which("mpiexec") is None:
        pytest.skip("no Open MPI (apt-get install openmpi-bin)")
    pytest.importorskip("mpi4py", reason="ipyparallel's MPI engines need mpi4py (pip install -e '.[test]')")
    # MPI clusters share home directories: the connection files are where every node reads them
    ipython_dir = tempfile.mkdtemp(prefix="nbspawn-ipython-", dir="/var/tmp")
    hosts = ssh_nodes.tmpdir / "hosts"
    hosts.write_text("".join(f"{address} slots=1\n" for address in ssh_nodes.addresses))
    k = load_nbspawn(start_kernel(env={"IPYTHONDIR": ipython_dir}))
    try:
        # the guide's recipe; besides it, what this machine needs: root may run mpiexec, its ssh takes
        # the nodes' config, and its daemons talk over the nodes' network (not this machine's others)
        mpi_args = ["--map-by", "ppr:1:node", "--hostfile", str(hosts)]
        here = [
            "--allow-run-as-root",
            "--mca",
            "plm_rsh_args",
            f"-F {ssh_nodes.ssh_config}",
            "--mca",
            "oob_tcp_if_include",
            str(ssh_nodes.network),
        ]
        ok(
            k,
            f"""
import ipyparallel as ipp
mpi_cluster = ipp.Cluster(n=2, engines="mpi", controller_ip={ssh_nodes.root_address!r})
mpi_cluster.config.MPIEngineSetLauncher.mpi_args = {mpi_args + here + ["-x", "IPP_CONNECTION_INFO"]!r}
rc = mpi_cluster.start_and_connect_sync()
print(sorted(rc[:].apply_sync(__import__("socket").gethostname)))
""",
            timeout=180,
        )
        yield k
        ok(k, "mpi_cluster.stop_cluster_sync()", timeout=60)
    finally:
        stop_kernel(k)
        shutil.rmtree(ipython_dir, ignore_errors=True)


def test_the_mpi_recipe_runs_a_cell_across_the_nodes_and_names_a_failing_ones_node(mpi_kernel):
    out = ok(
        mpi_kernel,
        GLOO_ACROSS_THE_NODES,
        timeout=120,
    ).stdout
    assert "[rank0]: node0 rank 0 sum 2.0" in out and "[rank1]: node1 rank 1 sum 2.0" in out, out
    failed = run(
        mpi_kernel,
        "%%spawn --cluster rc -n 1\nimport os\nif os.environ['RANK'] == '0':\n    raise ValueError('bad shard')",
        timeout=120,
    )
    assert "rank 0 on node 0 (node0)" in failed.error_text and "ValueError: bad shard" in failed.error_text, failed.error_text
