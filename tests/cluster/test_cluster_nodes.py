"""Self-test of tests/cluster/cluster_nodes.py: the clusters that `%%spawn --cluster` tests run on.

Only ipyparallel (and torch for gloo) here, no nbspawn: if these fail, the cluster tests' failures
say nothing about nbspawn. Each cluster is started once per module (a start costs seconds) and its
teardown is checked in the fixture: nothing may be left running or lying around.
"""

from __future__ import annotations

import ipaddress
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import ipyparallel as ipp
import psutil
import pytest
from cluster_nodes import NODE_ENV, LocalNodes, NetnsNodes, clean_stale, netns_skip_reason


def _gone(procs: list[psutil.Process]) -> list[int]:
    """The pids among `procs` still running (a zombie is gone: only its reaping is pending)."""
    alive = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p.pid)
        except psutil.Error:
            pass
    return alive


@ipp.interactive  # engines cannot import this module: send the code, not a reference
def _busy(seconds: float, marker: str) -> None:
    """Run on an engine: make ``marker`` (the nodes share this machine's files), then sleep."""
    import time

    open(marker, "w").close()
    time.sleep(seconds)


def _busy_task(rc, eid: int, tmp_path: Path, timeout: float = 25.0):
    """`_busy` on engine `eid` (30 s), once it runs (a signal sent before would hit an idle engine).  The
    task says so in a file, not on stdout: its stdout comes through the hub's iopub, which a client that
    has just connected may not hear yet (a PUB socket drops what a subscriber not yet joined would get:
    ci66's test never saw "busy" in 25 s, on 2 loaded cores)."""
    marker = tmp_path / f"busy-{eid}-{time.monotonic_ns()}"
    ar = rc[eid].apply_async(_busy, 30, str(marker))
    deadline = time.monotonic() + timeout
    while not marker.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"the task never started: {ar!r}; the engine's queue: {rc.queue_status(targets=[eid])}")
        time.sleep(0.02)
    time.sleep(0.1)  # from open() to time.sleep()
    return ar


def _check_interrupt(rc, eid: int, pid: int, tmp_path: Path) -> None:
    """Client.send_signal(SIGINT) reaches an engine busy in time.sleep (through its nanny), and the
    engine stays usable: what interrupting a `%%spawn --cluster` cell relies on."""
    ar = _busy_task(rc, eid, tmp_path)
    t0 = time.monotonic()
    rc.send_signal(signal.SIGINT, targets=[eid], block=True)
    with pytest.raises(ipp.error.RemoteError) as info:
        ar.get(timeout=60)  # the task sleeps 30 s: it ends in KeyboardInterrupt only if the SIGINT reached it
    assert info.value.ename == "KeyboardInterrupt"
    assert time.monotonic() - t0 < 60  # a hang guard
    assert rc[eid].apply_sync(os.getpid) == pid


@ipp.interactive  # engines cannot import this module: send the code, not a reference
def _engine_info():
    import os
    import socket

    import psutil

    addrs = {name: [a.address for a in lst if a.family == socket.AF_INET] for name, lst in psutil.net_if_addrs().items()}
    host = socket.gethostname()
    return {
        "pid": os.getpid(),
        "env": dict(os.environ),
        "hostname": host,
        "resolved": socket.gethostbyname(host),
        "addrs": addrs,
        "hosts": {h: socket.gethostbyname(h) for h in ("node0", "node1")} if host.startswith("node") else {},
    }


@ipp.interactive  # engines cannot import this module: send the code, not a reference
def _gloo_allreduce(rank: int, world: int, master: str, port: int, ifname: str):
    """One rank of a gloo group whose ranks are on different nodes (run on an engine)."""
    import datetime
    import os

    # without it gloo takes the address the hostname resolves to: 127.0.1.1 here, as on Debian
    os.environ["GLOO_SOCKET_IFNAME"] = ifname
    import torch
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", rank=rank, world_size=world, init_method=f"tcp://{master}:{port}", timeout=datetime.timedelta(seconds=30)
    )
    try:
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t)
        return t.item()
    finally:
        dist.destroy_process_group()


# ----------------------------------------------------------------------------------------------
# LocalNodes
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def local():
    t0 = time.monotonic()
    c = LocalNodes(nodes=2, engines_per_node=2)
    with c:
        print(f"LocalNodes(2 x 2) started in {time.monotonic() - t0:.1f} s")
        procs = c.processes()
        tmpdir = c.tmpdir
        yield c
        t0 = time.monotonic()
    print(f"LocalNodes stopped in {time.monotonic() - t0:.2f} s")
    assert not _gone(procs), "processes left running"
    assert tmpdir is not None and not tmpdir.exists()


def test_local_nodes_layout(local):
    assert sorted(local.engine_pids) == [0, 1, 2, 3]
    assert sorted(local.node_of.values()) == [0, 0, 1, 1]
    # engine ids come in registration order: node 0 need not have the lowest
    assert sorted(local.engines_of(0) + local.engines_of(1)) == sorted(local.engine_pids)
    assert Path(local.url_file).is_file()
    # controller + its schedulers + an engine and a nanny per engine
    names = [" ".join(p.cmdline()) for p in local.processes()]
    assert sum("ipyparallel.engine.nanny" in n for n in names) == 4


def test_local_nodes_environment(local):
    rc = local.client()
    info = rc[:].apply_async(_engine_info).get_dict(timeout=30)
    for eid, got in info.items():
        assert got["pid"] == local.engine_pids[eid]
        assert got["env"][NODE_ENV] == f"node{local.node_of[eid]}"


def test_local_nodes_interrupt(local, tmp_path):
    rc = local.client()
    eid = local.engines_of(1)[0]
    _check_interrupt(rc, eid, local.engine_pids[eid], tmp_path)


def test_local_nodes_kill_engine(local, tmp_path):
    """Last of the module's tests: it takes an engine away."""
    rc = local.client()
    victim = local.engines_of(0)[-1]
    ar = _busy_task(rc, victim, tmp_path)
    local.kill_engine(victim)
    assert (
        not psutil.pid_exists(local.engine_pids[victim])
        or psutil.Process(local.engine_pids[victim]).status() == psutil.STATUS_ZOMBIE
    )
    # the controller (told by the engine's nanny) fails the pending task: not an EngineError itself
    # but a RemoteError naming it, as for any error raised on an engine
    with pytest.raises(ipp.error.RemoteError) as info:
        ar.get(timeout=20)
    assert info.value.ename == "EngineError"
    deadline = time.monotonic() + 20
    while victim in rc.ids:
        assert time.monotonic() < deadline, "the client still lists the killed engine"
        time.sleep(0.05)
    assert sorted(rc.ids) == sorted(e for e in local.engine_pids if e != victim)


# ----------------------------------------------------------------------------------------------
# NetnsNodes
# ----------------------------------------------------------------------------------------------

needs_netns = pytest.mark.skipif(netns_skip_reason() is not None, reason=f"NetnsNodes: {netns_skip_reason()}")


def _netns_names() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def netns():
    t0 = time.monotonic()
    c = NetnsNodes(nodes=2, engines_per_node=1)
    with c:
        print(f"NetnsNodes(2 x 1) started in {time.monotonic() - t0:.1f} s")
        procs = c.processes()
        yield c
        t0 = time.monotonic()
    print(f"NetnsNodes stopped in {time.monotonic() - t0:.2f} s")
    assert not _gone(procs), "processes left running"
    names = _netns_names()
    assert not [ns for ns in [c.hub_ns, *c.node_ns] if ns in names]
    assert subprocess.run(["ip", "link", "show", c.root_link], capture_output=True).returncode != 0
    assert not [ns for ns in c.node_ns if Path("/etc/netns", ns).exists()]
    assert c.tmpdir is not None and not c.tmpdir.exists()


@needs_netns
def test_netns_nodes_identity(netns):
    rc = netns.client()
    info = rc[:].apply_async(_engine_info).get_dict(timeout=30)
    assert sorted(netns.node_of.values()) == [0, 1]
    for eid, got in info.items():
        node = netns.node_of[eid]
        assert got["pid"] == netns.engine_pids[eid]
        assert NODE_ENV not in got["env"]  # told apart by hostname, not NBSPAWN_NODE
        assert got["hostname"] == netns.hostnames[node]
        own = got["addrs"][netns.ifnames[node]]
        assert own == [netns.addresses[node]]
        assert ipaddress.ip_address(own[0]) in netns.network
        assert not ipaddress.ip_address(own[0]).is_loopback
        # the pitfall: the node's own hostname resolves to loopback, as on a stock Debian install
        assert got["resolved"] == "127.0.1.1"
        other = 1 - node
        assert got["hosts"][netns.hostnames[other]] == netns.addresses[other]


@needs_netns
def test_netns_nodes_reachable_from_a_separate_process(netns):
    """A kernel under test is a separate process in the root namespace: it connects by url_file."""
    code = "import sys, ipyparallel as ipp; rc = ipp.Client(sys.argv[1]); rc.wait_for_engines(2, timeout=20); print(sorted(rc.ids)); rc.close()"
    r = subprocess.run([sys.executable, "-c", code, netns.url_file], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(sorted(netns.engine_pids))


@needs_netns
def test_netns_nodes_gloo_across_nodes(netns):
    rc = netns.client()
    port = random.randint(20000, 40000)
    master = netns.addresses[0]
    ars = []
    for node in (0, 1):
        (eid,) = netns.engines_of(node)
        ars.append(rc[eid].apply_async(_gloo_allreduce, node, 2, master, port, netns.ifnames[node]))
    assert [ar.get(timeout=90) for ar in ars] == [3.0, 3.0]


@needs_netns
def test_netns_nodes_interrupt(netns, tmp_path):
    rc = netns.client()
    eid = netns.engines_of(1)[0]
    _check_interrupt(rc, eid, netns.engine_pids[eid], tmp_path)


@ipp.interactive
def _shm_probe(name: str):
    """Run on an engine: write a file into /dev/shm, then list what /dev/shm holds."""
    import os

    with open(f"/dev/shm/{name}", "w") as f:
        f.write("x")
    return sorted(os.listdir("/dev/shm"))


@needs_netns
def test_netns_private_shm():
    """private_shm=True: each node has a /dev/shm of its own, as separate machines do."""
    with NetnsNodes(nodes=2, engines_per_node=1, private_shm=True) as c:
        rc = c.client()
        seen = {n: rc[c.engines_of(n)[0]].apply_sync(_shm_probe, f"probe-{n}") for n in (0, 1)}
        assert seen == {0: ["probe-0"], 1: ["probe-1"]}
        assert [sorted(os.listdir(d)) for d in c.shm_dirs] == [["probe-0"], ["probe-1"]]
        assert not [n for n in os.listdir("/dev/shm") if n.startswith("probe-")]
        r = c.run_in_node(1, ["sh", "-c", "hostname; ls /dev/shm"])
        assert r.stdout.split() == [c.hostnames[1], "probe-1"], r
        dirs = list(c.shm_dirs)
    assert not [d for d in dirs if d.exists()]


@needs_netns
def test_netns_clean_stale():
    """What a test run killed before its teardown leaves behind is removed by the next one."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    tag = f"{dead.pid}q"
    assert not psutil.pid_exists(dead.pid)
    ns, link, etc = f"nbs{tag}-hub", f"nbsh{tag}", Path(f"/etc/netns/nbs{tag}-n0")
    subprocess.run(["ip", "netns", "add", ns], check=True)
    subprocess.run(["ip", "link", "add", link, "type", "veth", "peer", "name", "x", "netns", ns], check=True)
    etc.mkdir(parents=True)
    sleeper = subprocess.Popen(["ip", "netns", "exec", ns, "sleep", "60"], start_new_session=True)
    try:
        deadline = time.monotonic() + 5
        while not subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.strip():
            assert time.monotonic() < deadline
            time.sleep(0.02)
        removed = clean_stale()
        assert f"netns {ns}" in removed
        assert sleeper.wait(timeout=10) == -signal.SIGKILL
        assert ns not in _netns_names()
        assert not etc.exists()
        deadline = time.monotonic() + 5  # the namespace's own links go asynchronously
        while subprocess.run(["ip", "link", "show", link], capture_output=True).returncode == 0:
            assert time.monotonic() < deadline, f"{link} is still there"
            time.sleep(0.05)
    finally:
        if sleeper.poll() is None:
            os.killpg(sleeper.pid, signal.SIGKILL)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", link], capture_output=True)
        if etc.exists():
            etc.rmdir()
