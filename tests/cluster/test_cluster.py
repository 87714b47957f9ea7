"""``%%spawn --cluster``: the same cell on several nodes, over real ipyparallel controllers and engines.

Two tiers (``tests/cluster/cluster_nodes.py`` starts them):

* always: engines on this machine posing as two nodes (``NBSPAWN_NODE`` in each engine's environment
  is the node's name; users never set it: real nodes are told apart by their hostname);
* as root: real network separation, one Linux network namespace per node with its own address,
  hostname (which resolves to 127.0.1.1 there, as on Debian) and /etc/hosts, the controller in a
  namespace of its own; the kernel under test connects to it across a bridge.

The kernel under test is a real ipykernel driven over the Jupyter protocol; its ranks run on the
engines.  After every run, nothing of it may remain on any node.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import threading
import time

import psutil
import pytest
from cluster_harness import (
    assert_nothing_left,
    connected_kernel,
    engines_idle,
    is_running,
    process_or_none,
    rank_processes,
    ranks_on_every_node,
    wait_for_ranks,
)
from kernel_harness import blocked_line, execute, interrupt_later, listening, ok, ready_line, sockets_of, wait_until_blocked

pytestmark = pytest.mark.timeout(300)


ALL_REDUCE = """%%spawn --cluster rc -n 2 --backend gloo --out got
import os, torch, torch.distributed as dist
t = torch.ones(2) * (dist.get_rank() + 1)
dist.all_reduce(t)
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "MASTER_ADDR", "GLOO_SOCKET_IFNAME")
got = {"sum": t.tolist(), "env": {k: os.environ.get(k) for k in keys}, "base": base.tolist(), "node": os.environ.get("NBSPAWN_NODE")}
print("rank", dist.get_rank(), "sum", t[0].item())
"""


def check_all_reduce(kernel, loopback_ok: bool = False) -> list[dict]:
    ok(kernel, "import torch\nbase = torch.arange(3)")
    result = ok(kernel, ALL_REDUCE)
    assert "nbspawn: 2 nodes x 2 ranks, MASTER_ADDR" in result.stdout  # the node order, said
    for rank in range(4):
        assert f"[rank{rank}]: rank {rank} sum 10.0" in result.stdout
    got = json.loads(ok(kernel, "import json\nprint(json.dumps(got))").stdout)
    assert len(got) == 4
    master = got[0]["env"]["MASTER_ADDR"]
    assert loopback_ok or not master.startswith("127."), master
    for rank, value in enumerate(got):
        env = value["env"]
        assert value["sum"] == [10.0, 10.0] and value["base"] == [0, 1, 2]  # a kernel name, by value
        assert env["RANK"] == str(rank) and env["LOCAL_RANK"] == str(rank % 2)
        assert env["WORLD_SIZE"] == "4" and env["LOCAL_WORLD_SIZE"] == "2"
        assert env["GROUP_RANK"] == str(rank // 2) and env["GROUP_WORLD_SIZE"] == "2"
        assert env["MASTER_ADDR"] == master and env["GLOO_SOCKET_IFNAME"]
    return got


def test_two_nodes_all_reduce_with_torchrun_environment_and_out(kernel, nodes):
    got = check_all_reduce(kernel)
    assert got[0]["node"] == got[1]["node"] != got[2]["node"] == got[3]["node"]  # 2 ranks per node
    assert_nothing_left(nodes)


def test_the_kernels_settings_reach_every_node(kernel, nodes):
    """Each node's ranks start with the kernel's settings, all but what the kernel settles for the nodes
    (``planning._cluster.settled_for_nodes``): ``--xray off`` reaches them, where the nodes' settings,
    once written field by field, left it out and every node X-rayed (its ranks' flight recorder is
    then the small ring, not the X-ray's long one)."""
    body = "import os\nring = os.environ.get('TORCH_FR_BUFFER_SIZE') or os.environ.get('TORCH_NCCL_TRACE_BUFFER_SIZE')\n"
    ok(kernel, f"%%spawn --cluster rc -n 1 --backend gloo --xray off --out ring\n{body}")
    assert json.loads(ok(kernel, "import json\nprint(json.dumps(ring))").stdout) == ["256", "256"]
    ok(kernel, f"%%spawn --cluster rc -n 1 --backend gloo --out ring\n{body}")
    assert json.loads(ok(kernel, "import json\nprint(json.dumps(ring))").stdout) == ["4096", "4096"]
    assert_nothing_left(nodes)


def test_failure_on_node_1_stops_node_0_at_once_and_names_the_node(kernel, nodes, tmp_path):
    # rank 2 fails once the others are in their sleep (their ready line, on its line, before it), not a
    # second after it started; a grace of 120 s: a rank that needed SIGKILL would outlive the failure by that
    code = (
        "%%spawn --cluster rc -n 2 --grace-period 120\n"
        "import os, time\n"
        "rank = int(os.environ['RANK'])\n"
        "def step():\n"
        "    return 1 / 0\n"
        "if rank == 2:\n"
        f"    {blocked_line(tmp_path, 3)}\n"
        "    step()\n"
        f"{ready_line(tmp_path)}; time.sleep(300)\n"
    )
    result = execute(kernel.client, code, timeout=180)
    assert result.status == "error" and result.error.ename == "RankRaisedError"
    text = result.error.traceback_text
    assert "rank 2 on node 1 (" in text and "ZeroDivisionError" in text
    assert "Cell In[" in text and "return 1 / 0" in text and "step()" in text  # in the cell's own lines
    assert "ranks 0-1,3 were stopped the same way" in text and "time.sleep(300)" in text  # where they were
    assert "Logs, on each node: node 0 (" in text
    # how long the other ranks outlived the failure, as the kernel saw them end
    facts = json.loads(
        ok(
            kernel,
            "import json, os\nrun = nbspawn.last_run()\n"
            "err = json.load(open(os.path.join(run.ranks[2].dir, 'error.json')))\n"
            "print(json.dumps({'failed': err['nbspawn']['time'], 'ended': [r.ended_at for r in run.ranks], 'nodes': [r.node for r in run.ranks]}))",
        ).stdout
    )
    gone = max(facts["ended"][0], facts["ended"][1]) - facts["failed"]
    print(f"node 0's ranks were gone {gone * 1000:.0f} ms after rank 2 on node 1 failed")
    assert gone < 30, gone  # stopped by the failure's SIGTERM, not the SIGKILL 120 s after it
    assert facts["nodes"][0].startswith("node 0") and facts["nodes"][2].startswith("node 1")
    assert_nothing_left(nodes)
    engines_idle(nodes)


def test_a_hang_across_nodes_gets_its_verdict_at_the_timeout(kernel, nodes):
    """Ranks on both nodes wait in a barrier that rank 2 (node 1) never enters: what the nodes' agents
    see when the kernel asks them at the timeout, before any rank is stopped, makes the verdict (the
    same one a run on one machine gets: the collective's number, how long they waited)."""
    # the --timeout counts from the run's start (agents, forks, gloo across nodes): long enough that only a
    # hang would leave a rank short of its place when it fires (8 s was not, on a loaded machine); it costs its 30 s
    code = (
        "%%spawn --cluster rc -n 2 --backend gloo --timeout 30\n"
        "import time, torch.distributed as dist\n"
        "if dist.get_rank() != 2:\n"
        "    dist.barrier()\n"
        "else:\n"
        "    time.sleep(300)\n"
    )
    result = execute(kernel.client, code, timeout=150)
    assert result.status == "error" and result.error.ename == "SpawnTimeoutError", result.error_text
    text = result.error.traceback_text
    assert re.search(
        r"^Hang: rank 2 on node 1 \(\S+\) never entered barrier #1 \(it is at Cell In\[\d+\], line 6: time\.sleep\(300\)\); "
        r"ranks 0-1,3 waited in it for \d+ s at Cell In\[\d+\], line 4: dist\.barrier\(\)$",
        text,
        re.M,
    ), text
    # the X-ray draws it too: each node's agent sent its ranks' records with their ends
    xray = ok(kernel, "import nbspawn\nprint(nbspawn.last_run().xray.summary)").stdout
    assert "Ranks 0, 1, 3 entered barrier #1; rank 2 never did" in xray, xray
    assert_nothing_left(nodes)
    engines_idle(nodes)


def test_the_x_ray_lines_up_the_collectives_of_every_node(kernel, nodes):
    """Rank 3 (node 1) comes late to each all_reduce (by 0.6 s: more than a loaded machine's other ranks
    ever lag): the kernel's X-ray, made of the records the nodes' agents sent with their ranks' ends,
    names it, as a run on one machine does."""
    code = (
        "%%spawn --cluster rc -n 2 --backend gloo\n"
        "import time, torch, torch.distributed as dist\n"
        "t = torch.ones(4)\n"
        "for _ in range(5):\n"
        "    if dist.get_rank() == 3:\n"
        "        time.sleep(0.6)\n"
        "    dist.all_reduce(t)\n"
    )
    ok(kernel, code)
    xray = ok(kernel, "import nbspawn\nprint(nbspawn.last_run().xray.summary)").stdout.strip()
    assert xray.startswith("5 collectives, ") and xray.endswith("rank 3 is the straggler"), xray


def test_each_nodes_ranks_costs_reach_the_kernel_live_and_saved(kernel, nodes):
    """#44 on a cluster: each node's agent samples its own ranks (its machine's /proc) and sends their
    figures with its batches; the kernel's view shows them live and keeps each rank's peak. Rank 3
    (node 1) holds 400 MB more than the others."""
    from widget_harness import spawn_widget

    from nbspawn.views._bundle import MIME

    body = "import os, time, torch\nheld = torch.ones(100_000_000) if int(os.environ['RANK']) == 3 else None\ntime.sleep(3)\n"
    result, widget = spawn_widget(kernel, body, options="--cluster rc -n 2 --backend gloo")
    assert result.status == "ok", result.error_text
    live = [u["ranks"] for u in widget.updates if u.get("ranks") and any(r.get("rss") for r in u["ranks"])]
    assert live, "no live update carried a node's rank's memory"
    assert widget.frozen is not None
    peaks = [r["peak_rss"] for r in widget.frozen[MIME]["ranks"]]
    assert all(peaks) and len(peaks) == 4, peaks
    grew = peaks[3] - max(peaks[:3])
    assert abs(grew - 400_000_000) <= 40_000_000, peaks
    said = ok(kernel, "import nbspawn\nprint([s.peak_rss for s in nbspawn.last_run().ranks])").stdout.strip()
    assert said == str(peaks)


def test_interrupt_reaches_every_node(kernel, nodes, tmp_path):
    # interrupted once every rank is in its sleep (not a second after they existed); a grace none needs
    code = (
        f"%%spawn --cluster rc -n 2 --grace-period 120\nimport time\ndef train():\n    {ready_line(tmp_path)}; time.sleep(300)\n"
        "train()"
    )
    thread = interrupt_later(kernel, tmp_path, 4)
    started = time.monotonic()
    result = execute(kernel.client, code, timeout=120)
    thread.join()
    assert result.status == "error" and result.error.ename == "SpawnInterrupted"
    text = result.error.traceback_text
    assert "ranks 0-3 were stopped the same way: KeyboardInterrupt" in text and "time.sleep(300)" in text
    assert time.monotonic() - started < 90  # a hang guard: the grace alone would be 120 s
    assert_nothing_left(nodes)
    engines_idle(nodes)
    ok(kernel, "%%spawn --cluster rc -n 1\nprint('again')")  # the engines are reusable at once


def test_bad_input_is_a_short_error_and_starts_nothing(kernel, nodes):
    before = rank_processes(nodes)
    cases = {
        "%%spawn --cluster rc --share base\npass": "--share does not work on a cluster",
        "%%spawn --cluster rc --world w --bg\npass": "--bg runs on fresh ranks",
        "%%spawn --cluster rc --nodes 3\npass": "--nodes 3: the cluster has 2 node(s)",
        "%%spawn --cluster nope\npass": "--cluster nope: no such name in this kernel",
        "%%spawn --cluster base\npass": "not an ipyparallel Client",
        "%%spawn --nodes 2\npass": "--nodes needs --cluster",
        "%%spawn --cluster rc\nprint(lock)": "cannot send 'lock' (a _thread.lock) to other nodes",
        "%spawn --cluster rc -- no_such_script.py": "node 0 (",
    }
    ok(kernel, "import threading\nlock = threading.Lock()")
    for code, said in cases.items():
        result = execute(kernel.client, code, timeout=60)
        assert result.status == "error" and result.error.ename == "UsageError", (code, result.error)
        assert said in result.error.evalue, (code, result.error.evalue)
        assert len(result.error.traceback) <= 1  # one line, no internal traceback
    assert "no such script: no_such_script.py" in execute(kernel.client, "%spawn --cluster rc -- no_such_script.py").error.evalue
    assert rank_processes(nodes) == before


def test_program_runs_ddp_over_two_nodes(kernel, nodes, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(DDP_SCRIPT)
    result = ok(kernel, f"%spawn --cluster rc -n 2 -- {script} --steps 3")
    for rank in range(4):
        assert f"[rank{rank}]: ddp ok {rank} of 4 after 3 steps" in result.stdout
    # the program's collectives, every node's: DDP's own (its broadcast of the parameters, the buckets' all_reduces), the all_gather
    xray = ok(kernel, "import nbspawn\nprint(nbspawn.last_run().xray.summary)").stdout.strip()
    assert re.match(r"\d+ collectives, ", xray), xray
    assert_nothing_left(nodes)


DDP_SCRIPT = """
import argparse
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int)
args = parser.parse_args()
dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
torch.manual_seed(dist.get_rank())
for _ in range(args.steps):
    opt.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    opt.step()
flat = torch.cat([p.detach().flatten() for p in model.parameters()])
gathered = [torch.zeros_like(flat) for _ in range(dist.get_world_size())]
dist.all_gather(gathered, flat)
assert all(torch.equal(gathered[0], g) for g in gathered), "replicas diverged"
print("ddp ok", dist.get_rank(), "of", dist.get_world_size(), "after", args.steps, "steps", flush=True)
dist.destroy_process_group()
"""


def test_output_reaches_the_kernel_batched_within_budget(kernel, nodes):
    code = (
        "%%spawn --cluster rc -n 2\n"
        "import time\n"
        "t = time.time(); i = 0\n"
        "while time.time() - t < 3:\n"
        "    print('line', i); i += 1\n"
        "    time.sleep(0.0005)\n"
        "print('last line', i, flush=True)\n"
    )
    result = ok(kernel, code)
    for rank in range(4):
        assert f"[rank{rank}]: last line" in result.stdout
    facts = json.loads(
        ok(kernel, "run = nbspawn.last_run()\nprint(json.dumps({'batches': run.node_batches, 'took': run.duration}))").stdout
    )
    rate = sum(facts["batches"]) / facts["took"]
    print(f"{sum(facts['batches'])} data messages from 2 nodes in {facts['took']:.2f} s: {rate:.1f} a second")
    # at most 10 a second in all (each node every 0.2 s), plus each node's first (its pids)
    assert sum(facts["batches"]) <= 10 * facts["took"] + 2 * 2, facts
    assert_nothing_left(nodes)


def test_two_kernels_on_the_same_engines_keep_their_own_ports(kernel, nodes):
    """Each kernel remembers the port node 0's agent told it for its next run; another kernel's probe
    and runs there must not free it (the first kernel's next run then failed with EADDRINUSE)."""
    ok(kernel, "%%spawn --cluster rc -n 1\npass")
    book = "from nbspawn.cluster._plan import _known\nfacts = _known[rc][1]\nprint(facts[min(facts)]['port'])"
    booked = int(ok(kernel, book).stdout)
    with connected_kernel(nodes) as other:
        ok(other, "%%spawn --cluster rc -n 1\npass")
    agent = sorted(nodes.engine_pids)[0]
    held = nodes.client()[agent].apply_sync(eval, "sorted(__import__('nbspawn._listen', fromlist=['_'])._held)")
    assert booked in held, (booked, held)
    # a collective, not only init: gloo's connectFullMesh can return on one rank before the other has
    # finished, and a rank that then exits at once cuts the other's handshake ("Connection closed by
    # peer", the Colab job once: rank 0 printed, rank 1 failed in init_process_group)
    again = ok(
        kernel,
        "%%spawn --cluster rc -n 1 --backend gloo\nimport torch, torch.distributed as dist\n"
        "t = torch.ones(1)\ndist.all_reduce(t)\nprint('size', dist.get_world_size(), 'sum', t.item())",
    )
    assert again.stdout.count("size 2 sum 2.0") == 2, again.stdout
    assert_nothing_left(nodes)


def test_kernel_death_stops_every_node_within_seconds(nodes):
    with connected_kernel(nodes) as k:
        k.client.execute("%%spawn --cluster rc -n 2\nimport time\ntime.sleep(120)")
        wait_for_ranks(nodes, ranks_on_every_node(nodes))
        ranks = [p for kids in rank_processes(nodes).values() for p in kids]
        os.kill(k.pid, signal.SIGKILL)
        killed = time.monotonic()
        _gone, alive = psutil.wait_procs(ranks, timeout=60)  # a hang guard: an agent hears no heartbeat for 3 s
        took = time.monotonic() - killed
        print(f"every node's ranks were gone {took:.2f} s after the kernel was killed")
        assert not alive, alive
    assert_nothing_left(nodes)
    engines_idle(nodes)


def test_a_node_whose_engine_dies_fails_the_run_naming_it(kernel, nodes, tmp_path):
    """Last in this module: node 1 has no engine afterwards."""
    code = f"%%spawn --cluster rc -n 2\nimport time\n{ready_line(tmp_path)}; time.sleep(300)"
    agent = sorted(nodes.engine_pids)[1]  # nbspawn's node 1: nodes are ordered by their lowest engine id

    def kill() -> None:
        wait_until_blocked(tmp_path, 4)  # every rank in the cell's sleep, not half a second after they existed
        nodes.kill_engine(agent)

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    started = time.monotonic()
    result = execute(kernel.client, code, timeout=120)
    thread.join()
    assert result.status == "error", result.stdout
    text = result.error.traceback_text
    assert "node 1 (" in text and "was lost: its engine" in text and "died" in text, text
    assert time.monotonic() - started < 90  # a hang guard
    assert "ranks 0-1 were stopped" in text, text  # node 0's ranks
    print(text)
    del nodes.engine_pids[agent]
    assert_nothing_left(nodes)
    pids = json.loads(ok(kernel, "import json\nprint(json.dumps([r.pid for r in nbspawn.last_run().ranks]))").stdout)
    _gone, alive = psutil.wait_procs([p for p in map(process_or_none, pids) if p], timeout=30)
    assert not [p for p in alive if is_running(p)], alive  # the dead node's ranks died with their agent


# -- real network separation --------------------------------------------------------------------


def test_netns_all_reduce_across_namespaces_uses_the_routable_address(netns_kernel, netns_nodes):
    got = check_all_reduce(netns_kernel)
    master = got[0]["env"]["MASTER_ADDR"]
    assert master == netns_nodes.addresses[0] or master in netns_nodes.addresses, (master, netns_nodes.addresses)
    assert_nothing_left(netns_nodes)


def test_netns_failure_on_one_node_stops_the_other(netns_kernel, netns_nodes):
    code = (
        "%%spawn --cluster rc -n 2 --backend gloo\n"
        "import os, time, torch, torch.distributed as dist\n"
        "if dist.get_rank() == 3:\n"
        "    raise RuntimeError('bad batch on rank 3')\n"
        "time.sleep(60)\n"
    )
    result = execute(netns_kernel.client, code, timeout=60)
    assert result.status == "error"
    text = result.error.traceback_text
    assert "rank 3 on node 1 (" in text and "bad batch on rank 3" in text
    assert_nothing_left(netns_nodes)


def test_netns_ddp_program(netns_kernel, netns_nodes, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(DDP_SCRIPT)
    os.chmod(tmp_path, 0o755)
    result = ok(netns_kernel, f"%spawn --cluster rc -n 2 -- {script} --steps 2")
    for rank in range(4):
        assert f"[rank{rank}]: ddp ok {rank} of 4 after 2 steps" in result.stdout
    assert_nothing_left(netns_nodes)


def _net_namespace(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


WAITING = """%%spawn --cluster rc -n 2 --backend gloo
import os, time
with open(os.path.join({where!r}, 'ready' + os.environ['RANK']), 'w') as fh:
    fh.write(f"{{os.getpid()}} {{os.environ['MASTER_PORT']}}")
while not os.path.exists(os.path.join({where!r}, 'go')):
    time.sleep(0.05)
"""


def test_netns_nodes_listen_only_on_their_address_and_ranks_hold_no_engine_socket(netns_kernel, netns_nodes, tmp_path):
    """While every rank is in the group: node 0's store and each node's gloo sockets are bound to the
    node's own address (nothing on every interface), the header says so, and no rank holds a socket
    of the engine that started it (its ZMQ connections to the controller)."""
    where = str(tmp_path)
    os.chmod(tmp_path, 0o777)  # the nodes' ranks write their pids here
    results: list = []  # the cell's own output (its header), read by this thread while the test looks
    cell = threading.Thread(target=lambda: results.append(execute(netns_kernel.client, WAITING.format(where=where), 120)))
    cell.start()
    try:
        said = {}
        deadline = time.monotonic() + 60
        while len(said) < 4 and time.monotonic() < deadline:
            for rank in range(4):
                with contextlib.suppress(OSError), open(os.path.join(where, f"ready{rank}")) as fh:
                    text = fh.read().split()
                    if len(text) == 2:
                        said[rank] = [int(v) for v in text]
            time.sleep(0.05)
        assert len(said) == 4, said
        port = said[0][1]
        for node in range(2):  # node i of the namespaces (the run may number them otherwise)
            address = netns_nodes.addresses[node]
            agent = netns_nodes.engine_pids[netns_nodes.engines_of(node)[0]]
            ranks = [pid for pid, _port in said.values() if _net_namespace(pid) == _net_namespace(agent)]
            assert len(ranks) == 2, (node, said)
            for pid in ranks:
                bound = {a for a, _p in listening(pid).values()}
                assert bound and bound <= {address}, (node, pid, bound)  # gloo, on the node's interface only
                assert not sockets_of(pid) & sockets_of(agent), (node, pid)  # nothing of the engine's
            store = [a for a, p in listening(agent).values() if p == port]
            hosts = said[0][0] in ranks  # rank 0's node's agent hosts the store, on its address only
            assert store == ([address] if hosts else []), (node, store)
    finally:
        open(os.path.join(where, "go"), "w").close()
        cell.join(120)
    assert results and results[0].status == "ok", results
    assert f":{port}, listening on the node addresses below only" in results[0].stdout, results[0].stdout
    assert_nothing_left(netns_nodes)
