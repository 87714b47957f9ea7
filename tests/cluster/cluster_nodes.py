"""Real ipyparallel clusters whose engines are separate "nodes", for testing `%%spawn --cluster`.

`%%spawn --cluster` runs a cell on ranks spread over the engines of an ipyparallel cluster, one
group of ranks per node. Testing that needs real clusters, not mocks: the interesting failures
(a node dying, an interrupt that has to reach a busy engine, a hostname that resolves to loopback
and breaks gloo between nodes) only show up with real controllers, engines and sockets.

Two kinds of cluster, with the same interface:

- `LocalNodes` needs nothing special. All engines run on this machine; the engines of node i get
  NBSPAWN_NODE=node{i} in their environment, which is how nbspawn lets engines on one machine pose
  as separate nodes. Fast (a few seconds) and usable anywhere.
- `NetnsNodes` needs root (see `netns_skip_reason()`). Each node is a network namespace with its
  own address, interface (eth0), hostname (a UTS namespace) and /etc/hosts, the controller is in
  one more namespace, and all of them hang off one bridge. Nodes are told apart by their real
  hostnames, and each node's /etc/hosts maps its own hostname to 127.0.1.1 as Debian does, so the
  classic pitfall (a rendezvous or gloo address derived from the hostname is loopback, which the
  other nodes cannot reach) is reproduced.

Both are context managers that start everything on enter and, on exit (or on a failure half-way
through starting), kill every process they started and remove everything they created:

    with LocalNodes(nodes=2, engines_per_node=1) as c:
        rc = c.client()                  # an ipp.Client for the test process
        c.url_file                       # what a kernel under test passes to ipp.Client(c.url_file)
        c.engine_pids, c.node_of         # {engine id: pid}, {engine id: node index}
        c.kill_engine(eid)               # SIGKILL, as a crashed node would

Engines keep ipyparallel's default "nanny" process: it is what relays `Client.send_signal` (e.g. an
interrupt) to an engine busy running code, and what tells the controller promptly that an engine
died.

Teardown is deliberately SIGKILL, not a polite shutdown: tests only need everything gone, and a
polite stop costs seconds (the nanny of a stopped engine lingers up to 3 s trying to tell a
controller that may already be gone).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import ipaddress
import itertools
import json
import logging
import os
import platform
import re
import shutil
import signal
import string
import subprocess
import sys
import tempfile
import time
from functools import lru_cache
from pathlib import Path
from typing import Any

import psutil

NODE_ENV = "NBSPAWN_NODE"
"""The environment variable that makes engines on one machine count as separate nodes."""

START_TIMEOUT = 60.0
"""Seconds to wait for the controller and all engines; generous, for a loaded 2-core machine."""

HEARTBEAT_MS = 500
"""The controller's heartbeat period. An engine's registration completes only once the controller
has seen its heart beat, which takes up to two periods: ipyparallel's default (3000 ms) would add
several seconds to every start."""

HEARTBEAT_MISSES = 20
"""Missed beats before the controller declares an engine dead: 20 x 500 ms keeps ipyparallel's
default tolerance of 10 s (the engine's heart is a zmq device in its own C thread, so it beats even
while Python is busy, but a loaded 2-core box can starve it for a while). A SIGKILLed engine is
noticed long before that anyway: its nanny tells the controller at once."""

_HEARTBEAT_ARGS = [f"--HeartMonitor.period={HEARTBEAT_MS}", f"--HeartMonitor.max_heartmonitor_misses={HEARTBEAT_MISSES}"]

_ENV_DROP = (NODE_ENV, "IPP_CONNECTION_INFO", "IPP_CLUSTER_ID", "IPP_PROFILE_DIR")
"""Variables a parent process (e.g. a test run inside an engine) may carry that would confuse ours."""


def _child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _ENV_DROP}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        return f"<{path}: {e}>"
    return "".join(text.splitlines(True)[-lines:])


def _kill_all(procs: list[psutil.Process], timeout: float = 10.0) -> list[psutil.Process]:
    """SIGKILL `procs` and wait until they are gone (or zombies); return those still alive."""
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass
    # not psutil.wait_procs: it waits for zombies to be reaped by their parents (seconds, here)
    deadline = time.monotonic() + timeout
    alive = procs
    while True:
        alive = [p for p in alive if _running(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.01)


def _running(p: psutil.Process) -> bool:
    """Alive, and not a zombie waiting to be reaped by someone else (a zombie is already gone)."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _tree(pid: int) -> list[psutil.Process]:
    """The process and all its descendants (nannies are children of engines, schedulers of the
    controller: both start new sessions, so a process group would miss them)."""
    try:
        p = psutil.Process(pid)
        return [p, *p.children(recursive=True)]
    except psutil.Error:
        return []


class _Nodes:
    """What both kinds of cluster share: clients, the engine -> pid / node maps, kill_engine."""

    def __init__(self, nodes: int, engines_per_node: int, timeout: float) -> None:
        if nodes < 1 or engines_per_node < 1:
            raise ValueError("need at least one node and one engine per node")
        self.nodes = nodes
        self.engines_per_node = engines_per_node
        self.timeout = timeout
        self.url_file = ""
        """ipcontroller-<cluster id>-client.json: `ipp.Client(url_file)` connects to the cluster.
        Positionally: ipyparallel 9 silently ignores the keyword `url_file=` (it goes looking for
        the default profile's connection file instead, and times out)."""
        self.engine_pids: dict[int, int] = {}
        """{engine id: pid of the engine process} (the nanny is a child of that process)."""
        self.node_of: dict[int, int] = {}
        """{engine id: node index}. Engine ids are handed out in registration order, not launch
        order, so this is measured (by asking each engine its pid), never assumed."""
        self.tmpdir: Path | None = None
        self._clients: list[Any] = []
        self._closed = False

    # --- context manager -----------------------------------------------------------------------

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Start the cluster; on any failure, tear down what was started and re-raise."""
        atexit.register(self.close)  # a test run killed by an exception must not leave a cluster behind
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Kill everything, remove everything; idempotent. Raises if something could not be removed."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        for rc in self._clients:
            with contextlib.suppress(Exception):
                rc.close(linger=0)
        self._clients.clear()
        self._stop()

    def _start(self) -> None:
        raise NotImplementedError

    def _stop(self) -> None:
        raise NotImplementedError

    def processes(self) -> list[psutil.Process]:
        """Every live process of this cluster: controller (and its schedulers), engines, nannies."""
        raise NotImplementedError

    # --- the interface for tests -----------------------------------------------------------------

    def client(self, **kwargs: Any):
        """A new `ipp.Client` connected to the cluster, closed at teardown."""
        import ipyparallel as ipp

        rc = ipp.Client(self.url_file, **kwargs)
        self._clients.append(rc)
        return rc

    def engines_of(self, node: int) -> list[int]:
        """The engine ids of node `node`, sorted."""
        return sorted(e for e, n in self.node_of.items() if n == node)

    def kill_engine(self, engine_id: int, timeout: float = 10.0) -> None:
        """SIGKILL one engine process, as a crashed node would, and wait until it is dead.

        Only the engine: its nanny notices, tells the controller the engine is gone and exits,
        which is exactly what happens when a real node loses its engine. It does not wait for the
        controller or any client to notice; that is for the test to check."""
        pid = self.engine_pids[engine_id]
        try:
            p = psutil.Process(pid)
            p.kill()
        except psutil.NoSuchProcess:
            return
        deadline = time.monotonic() + timeout
        while _running(p):
            if time.monotonic() > deadline:
                raise TimeoutError(f"engine {engine_id} (pid {pid}) survived SIGKILL for {timeout} s")
            time.sleep(0.02)

    # --- shared start-up steps -------------------------------------------------------------------

    def _wait_for_engines(self, node_pids: dict[int, int], check_alive, engine_json: Path, engine_ready: Path) -> None:
        """Wait until every engine has registered, then map engine ids to pids and nodes.

        Engines are launched together with the controller, so that their start-up (about a second
        of imports and a nanny on a 2-core box) overlaps the controller's, and wait for
        `engine_ready`, which is published here by an atomic rename once the controller's
        `engine_json` is complete. (Pointing them straight at the controller's file races with its
        writing: an engine that finds it created but still empty fails to parse it.)

        `node_pids` is {pid as launched: node}; `check_alive()` raises if a launched process died,
        so a broken engine fails the start at once, with its log, rather than after the timeout."""
        try:
            self._wait_and_map(node_pids, check_alive, engine_json, engine_ready)
        except TimeoutError as e:
            raise TimeoutError(f"{e}\n{self._logs()}") from None

    def _logs(self) -> str:
        """The tails of the processes' logs, for a start that failed."""
        return ""

    def _wait_and_map(self, node_pids: dict[int, int], check_alive, engine_json: Path, engine_ready: Path) -> None:
        import ipyparallel as ipp

        n = self.nodes * self.engines_per_node
        deadline = time.monotonic() + self.timeout
        published = False
        rc = None
        while rc is None:
            check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"the controller wrote no complete {engine_json.name} in {self.timeout} s")
            if not published:
                published = _publish(engine_json, engine_ready)
            if published and _read_json(Path(self.url_file)) is not None:
                rc = ipp.Client(self.url_file)
            else:
                time.sleep(0.02)
        try:
            while len(rc.ids) < n:
                check_alive()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{len(rc.ids)} of {n} engines registered in {self.timeout} s")
                time.sleep(0.05)
            pids = rc[:].apply_async(os.getpid).get_dict(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            rc.close(linger=0)
        self.engine_pids = dict(sorted(pids.items()))
        unknown = {e: p for e, p in pids.items() if p not in node_pids}
        if unknown:
            raise RuntimeError(f"engines {unknown} (id: pid) are none of those launched: {node_pids}")
        self.node_of = {e: node_pids[p] for e, p in self.engine_pids.items()}


def _read_json(path: Path) -> dict[str, Any] | None:
    """The connection file's content, or None while it is missing or still being written."""
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) and "registration" in d else None


def _publish(src: Path, dst: Path) -> bool:
    """Copy a complete connection file to `dst` atomically; False while `src` is not complete."""
    d = _read_json(src)
    if d is None:
        return False
    tmp = dst.with_name(dst.name + ".tmp")
    tmp.write_text(json.dumps(d))
    os.replace(tmp, dst)
    return True


class LocalNodes(_Nodes):
    """An ipyparallel cluster on this machine whose engines pose as `nodes` separate nodes.

    The engines of node i run with NBSPAWN_NODE=node{i}. Everything lives under a private temp dir
    (profile dir, connection files, logs), and the controller listens on 127.0.0.1 with random
    ports, so parallel test sessions never collide. Started with `ipyparallel.Cluster`, one engine
    set per node (so the environment can differ per node), with the venv's python (sys.executable).
    """

    def __init__(self, nodes: int = 2, engines_per_node: int = 1, *, timeout: float = START_TIMEOUT) -> None:
        super().__init__(nodes, engines_per_node, timeout)
        self.cluster = None
        """The `ipyparallel.Cluster`, for anything this class does not wrap."""
        self._known: list[psutil.Process] = []

    def _start(self) -> None:
        import ipyparallel as ipp

        self.tmpdir = Path(tempfile.mkdtemp(prefix="nbspawn-ipp-"))
        self.cluster = cluster = ipp.Cluster(
            n=0,
            profile_dir=str(self.tmpdir / "profile"),
            cluster_id="nbs",
            controller_args=_HEARTBEAT_ARGS,
            load_profile=False,  # nothing from ~/.ipython: the same cluster on every machine
            log_level=logging.WARNING,
            engine_timeout=int(self.timeout),
            delay=0,
            # launch engines at once rather than after the controller is up (see _wait_for_engines)
            send_engines_connection_env=False,
        )
        security = self.tmpdir / "profile" / "security"
        engine_ready = self.tmpdir / "engine.json"
        cluster.start_controller_sync()
        self.url_file = cluster.controller.connection_files["client"]
        for i in range(self.nodes):
            cluster.start_engines_sync(
                n=self.engines_per_node,
                engine_set_id=f"node{i}",
                # "" hides a connection of an outer cluster (this test run inside an engine?)
                environment={NODE_ENV: f"node{i}", "IPP_CONNECTION_INFO": ""},
                engine_args=[f"--file={engine_ready}", f"--IPEngine.wait_for_url_file={self.timeout}"],
            )
        node_pids = {launcher.pid: i for i in range(self.nodes) for launcher in cluster.engines[f"node{i}"].launchers.values()}

        def check_alive() -> None:
            for name, launcher in self._launchers().items():
                try:
                    alive = _running(psutil.Process(launcher.pid))
                except psutil.Error:
                    alive = False
                if not alive:
                    raise RuntimeError(f"{name} (pid {launcher.pid}) exited while starting:\n{_tail(Path(launcher.output_file))}")

        self._wait_for_engines(node_pids, check_alive, security / "ipcontroller-nbs-engine.json", engine_ready)
        self._known = self.processes()

    def _launchers(self) -> dict[str, Any]:
        cluster = self.cluster
        launchers = {} if cluster is None or cluster.controller is None else {"controller": cluster.controller}
        if cluster is not None:
            for set_id, engine_set in cluster.engines.items():
                for j, launcher in engine_set.launchers.items():
                    launchers[f"{set_id}-engine{j}"] = launcher
        return launchers

    def _logs(self) -> str:
        return "\n".join(
            f"--- {name} ---\n{_tail(Path(launcher.output_file), 20)}" for name, launcher in self._launchers().items()
        )

    def processes(self) -> list[psutil.Process]:
        cluster = self.cluster
        if cluster is None:
            return []
        pids = []
        if cluster.controller is not None and cluster.controller.pid > 0:
            pids.append(cluster.controller.pid)
        pids += self.engine_pids.values()
        for engine_set in cluster.engines.values():
            pids += [launcher.pid for launcher in engine_set.launchers.values()]
        procs = {p.pid: p for pid in dict.fromkeys(pids) for p in _tree(pid)}
        return [p for p in procs.values() if _running(p)]

    def _stop(self) -> None:
        procs = {p.pid: p for p in [*self._known, *self.processes()]}
        alive = _kill_all(list(procs.values()))
        if self.cluster is not None:
            # the processes are gone: this only lets the Cluster's launchers notice and reap them
            with contextlib.suppress(Exception):
                self.cluster.stop_cluster_sync()
            self.cluster = None
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
        if alive:
            raise RuntimeError(f"LocalNodes: processes survived SIGKILL: {[p.pid for p in alive]}")


# ----------------------------------------------------------------------------------------------
# Network namespaces
# ----------------------------------------------------------------------------------------------

_NAME = re.compile(r"^nbs(?P<pid>\d+)(?P<seq>[a-z]+)-(?:hub|n\d+)$")
"""Namespaces (and their /etc/netns, /dev/shm dirs): nbs<pid of the test process><instance letters>-hub|-n<i>.
The creator's pid in every name is what lets clean_stale() tell a crashed run's leftovers from those
of a session still running."""
_LINK = re.compile(r"^nbsh(?P<pid>\d+)(?P<seq>[a-z]+)$")
"""The root namespace's end of its veth to the bridge (interface names are at most 15 chars)."""
_instances = itertools.count()
_live_tags: set[str] = set()
_LOCK = Path("/run/lock/nbspawn-netns.lock")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and r.returncode:
        raise RuntimeError(f"`ip {' '.join(args)}` failed ({r.returncode}): {r.stderr.strip()}")
    return r


def _letters(k: int) -> str:
    s = ""
    while True:
        s = string.ascii_lowercase[k % 26] + s
        k = k // 26 - 1
        if k < 0:
            return s


@lru_cache(maxsize=1)
def netns_skip_reason() -> str | None:
    """None when NetnsNodes can run here; otherwise why not, for `pytest.skip(reason)`.

    Probes for real (a namespace with a bridge, a veth, and a UTS namespace) rather than guessing
    from the kernel version, because containers grant root while denying exactly these."""
    if sys.platform != "linux":
        return "needs Linux network namespaces"
    if os.geteuid() != 0:
        return "needs root"
    for tool in ("ip", "unshare", "hostname"):
        if shutil.which(tool) is None:
            return f"{tool} not found"
    probe = f"nbs{os.getpid()}zz-hub"
    try:
        _ip("netns", "add", probe)
    except RuntimeError as e:
        return f"ip netns not available: {e}"
    try:
        _ip("-n", probe, "link", "add", "br0", "type", "bridge")
        _ip("-n", probe, "link", "add", "v0", "type", "veth", "peer", "name", "v1")
        r = subprocess.run(
            ["ip", "netns", "exec", probe, "unshare", "--uts", "hostname", "nbsprobe"], capture_output=True, text=True
        )
        if r.returncode:
            return f"unshare --uts not available: {r.stderr.strip()}"
    except RuntimeError as e:
        return f"bridge/veth not available: {e}"
    finally:
        _ip("netns", "del", probe, check=False)
    return None


def available() -> bool:
    """Whether NetnsNodes can run here (see netns_skip_reason for why not)."""
    return netns_skip_reason() is None


def _tag_alive(pid: int, tag: str, created: float | None) -> bool:
    """Whether the namespaces etc. tagged `tag` still belong to a live NetnsNodes."""
    if pid == os.getpid():
        return tag in _live_tags
    try:
        started = psutil.Process(pid).create_time()
    except psutil.Error:
        return False
    # a process with that pid started after the namespace was made is a reused pid, not its owner
    return created is None or started <= created + 1


def clean_stale() -> list[str]:
    """Remove namespaces, veths and dirs (/etc/netns, /dev/shm) left by NetnsNodes of dead processes.

    A test run killed by SIGKILL (a CI timeout, a crashed interpreter) never reaches teardown;
    without this its namespaces, processes and bridge would pile up. Returns what it removed."""
    removed: list[str] = []
    r = _ip("netns", "list", check=False)
    for line in r.stdout.splitlines():
        ns = line.split()[0] if line.split() else ""
        m = _NAME.match(ns)
        if not m:
            continue
        try:
            created = os.stat(f"/run/netns/{ns}").st_mtime
        except OSError:
            created = None
        tag = m["pid"] + m["seq"]
        if _tag_alive(int(m["pid"]), tag, created):
            continue
        _kill_netns(ns)
        _ip("netns", "del", ns, check=False)
        removed.append(f"netns {ns}")
    for parent in (Path("/etc/netns"), Path("/dev/shm")):  # hosts files; private /dev/shm dirs
        if not parent.is_dir():
            continue
        for d in parent.iterdir():
            m = _NAME.match(d.name)
            if m and d.is_dir() and not _tag_alive(int(m["pid"]), m["pid"] + m["seq"], None):
                shutil.rmtree(d, ignore_errors=True)
                removed.append(str(d))
    r = _ip("-o", "link", "show", check=False)
    for line in r.stdout.splitlines():
        parts = line.split(":")
        if len(parts) < 2:
            continue
        name = parts[1].strip().split("@")[0]
        m = _LINK.match(name)
        if m and not _tag_alive(int(m["pid"]), m["pid"] + m["seq"], None):
            _ip("link", "del", name, check=False)
            removed.append(f"link {name}")
    return removed


def _netns_pids(ns: str) -> list[int]:
    r = _ip("netns", "pids", ns, check=False)
    return [int(x) for x in r.stdout.split() if x.isdigit()]


def _kill_netns(ns: str, timeout: float = 10.0) -> list[int]:
    """SIGKILL every process in namespace `ns` (nannies included, which start their own sessions
    and so escape process groups), until none is left; return the pids that would not die."""
    deadline = time.monotonic() + timeout
    while True:
        procs = []
        for pid in _netns_pids(ns):
            with contextlib.suppress(psutil.Error):
                procs.append(psutil.Process(pid))
        procs = [p for p in procs if _running(p)]
        if not procs:
            return []
        alive = _kill_all(procs, timeout=max(0.1, min(2.0, deadline - time.monotonic())))
        if time.monotonic() > deadline:
            return [p.pid for p in alive]


def _used_networks() -> list[ipaddress.IPv4Network]:
    nets = []
    for args in (("-4", "-o", "addr", "show"), ("-4", "route", "show", "table", "all")):
        for tok in _ip(*args, check=False).stdout.split():
            with contextlib.suppress(ValueError):
                if "/" in tok or tok[:1].isdigit():
                    nets.append(ipaddress.IPv4Network(tok, strict=False))
    return nets


class NetnsNodes(_Nodes):
    """An ipyparallel cluster whose nodes are network namespaces: real network separation.

    Layout (X picked per instance, from the pid, avoiding any network already in use here):

        hub namespace (nbs<tag>-hub): bridge br0 = 10.213.X.1, the controller listens there
        node i (nbs<tag>-n<i>):       eth0 = 10.213.X.(10+i), hostname node<i>, its engines
                                      (NBSPAWN_NODE unset, even if set here)
        root namespace:               nbsh<tag> = 10.213.X.254, the test process and kernels

    The bridge lives in the hub namespace rather than in the root namespace on purpose: with
    br_netfilter loaded (net.bridge.bridge-nf-call-iptables=1, as Docker sets up) bridged frames go
    through the iptables FORWARD chain of the bridge's namespace, whose policy is DROP on a host
    running Docker. A fresh namespace has no rules at all, and its own copy of that sysctl (per
    namespace since Linux 5.3), which is also turned off there. The host firewall is not touched.
    Traffic between the root namespace and the cluster still passes the host's INPUT/OUTPUT chains;
    a host that drops incoming connections on unknown interfaces would block engines connecting to a
    kernel in the root namespace (they only reach the controller here, which is fine).

    Each node's processes run under `ip netns exec NS unshare --uts` with their own hostname, and
    /etc/netns/NS/hosts (bind-mounted over /etc/hosts by ip netns exec) maps the node's own
    hostname to 127.0.1.1 exactly as Debian's installer does, plus the other nodes' real
    addresses. NBSPAWN_NODE is not set: nodes are told apart by their real hostnames.
    """

    def __init__(
        self,
        nodes: int = 2,
        engines_per_node: int = 1,
        *,
        hostnames: list[str] | None = None,
        private_shm: bool = False,
        timeout: float = START_TIMEOUT,
    ) -> None:
        super().__init__(nodes, engines_per_node, timeout)
        self.hostnames = list(hostnames or [f"node{i}" for i in range(nodes)])
        """Node i's hostname."""
        if len(self.hostnames) != nodes:
            raise ValueError("one hostname per node")
        self.addresses: list[str] = []
        """Node i's IPv4 address (on its eth0)."""
        self.ifnames = ["eth0"] * nodes
        """Node i's interface carrying its address: what GLOO_SOCKET_IFNAME should name there."""
        self.controller_address = ""
        """The controller's address (on the bridge, in the hub namespace): in url_file."""
        self.root_address = ""
        """The root namespace's address on the bridge (the test process, kernels it starts)."""
        self.network: ipaddress.IPv4Network | None = None
        self.tag = f"{os.getpid()}{_letters(next(_instances))}"
        self.hub_ns = f"nbs{self.tag}-hub"
        self.node_ns = [f"nbs{self.tag}-n{i}" for i in range(nodes)]
        self.root_link = f"nbsh{self.tag}"
        self._procs: list[tuple[str, subprocess.Popen[bytes], Path]] = []
        self._made_ns: list[str] = []
        self._made_dirs: list[Path] = []
        self.private_shm = private_shm
        self.shm_dirs = [Path(f"/dev/shm/{ns}") if private_shm else Path("/dev/shm") for ns in self.node_ns]
        """Where node i's /dev/shm is, seen from here. By default every node shares this machine's
        /dev/shm; with private_shm=True each node gets a directory of this machine's /dev/shm
        (tmpfs) bind-mounted over its /dev/shm, as separate machines would have: a POSIX
        shared-memory file written on one node is then invisible on the others and to a kernel
        here, so code that wrongly passes data through /dev/shm across nodes fails as it would on
        a real cluster."""

    # --- network ---------------------------------------------------------------------------------

    def _pick_network(self) -> ipaddress.IPv4Network:
        """A private /24 that no address or route of this machine touches: 10.213.X.0/24 with X from
        the pid (so concurrent sessions start apart), else (a VPN routing all of 10/8, say) the same
        in 172.29/16 or 192.168/16."""
        used = [u for u in _used_networks() if u.prefixlen > 0]
        for pool in ("10.213.{}.0/24", "172.29.{}.0/24", "192.168.{}.0/24"):
            for k in range(250):
                net = ipaddress.IPv4Network(pool.format((os.getpid() + k) % 250 + 1))
                if not any(net.overlaps(u) for u in used):
                    return net
        raise RuntimeError("no free private /24 network")

    def _make_network(self) -> None:
        _live_tags.add(self.tag)
        _LOCK.parent.mkdir(parents=True, exist_ok=True)
        with open(_LOCK, "w") as lock:
            # two sessions starting at once must not pick the same network
            fcntl.flock(lock, fcntl.LOCK_EX)
            clean_stale()
            self.network = net = self._pick_network()
            hosts = list(net.hosts())
            self.controller_address = str(hosts[0])
            self.addresses = [str(hosts[9 + i]) for i in range(self.nodes)]
            self.root_address = str(hosts[-1])
            for ns in [self.hub_ns, *self.node_ns]:
                _ip("netns", "add", ns)
                self._made_ns.append(ns)
                _ip("-n", ns, "link", "set", "lo", "up")
            hub = ("-n", self.hub_ns)
            _ip(*hub, "link", "add", "br0", "type", "bridge")
            self._no_bridge_netfilter()
            for i, ns in enumerate(self.node_ns):
                # both ends created directly in their namespaces: no names to clash in the root one
                _ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", f"n{i}", "netns", self.hub_ns)
                _ip(*hub, "link", "set", f"n{i}", "master", "br0", "up")
                _ip("-n", ns, "addr", "add", f"{self.addresses[i]}/{net.prefixlen}", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("link", "add", self.root_link, "type", "veth", "peer", "name", "root", "netns", self.hub_ns)
            _ip(*hub, "link", "set", "root", "master", "br0", "up")
            _ip(*hub, "addr", "add", f"{self.controller_address}/{net.prefixlen}", "dev", "br0")
            _ip(*hub, "link", "set", "br0", "up")
            _ip("addr", "add", f"{self.root_address}/{net.prefixlen}", "dev", self.root_link)
            _ip("link", "set", self.root_link, "up")
        for i, ns in enumerate(self.node_ns):
            etc = Path("/etc/netns") / ns
            etc.mkdir(parents=True, exist_ok=True)
            self._made_dirs.append(etc)
            others = "".join(f"{self.addresses[j]}\t{self.hostnames[j]}\n" for j in range(self.nodes) if j != i)
            # Debian's default: the own hostname on 127.0.1.1 (the pitfall this class exists for)
            (etc / "hosts").write_text(
                f"127.0.0.1\tlocalhost\n127.0.1.1\t{self.hostnames[i]}\n{others}"
                f"{self.controller_address}\tnbs-controller\n\n"
                "::1\tlocalhost ip6-localhost ip6-loopback\nff02::1\tip6-allnodes\nff02::2\tip6-allrouters\n"
            )
            (etc / "hostname").write_text(f"{self.hostnames[i]}\n")
            if self.private_shm:
                shm = self.shm_dirs[i]
                shm.mkdir()
                self._made_dirs.append(shm)
                shm.chmod(0o1777)  # as /dev/shm itself: anyone may create, only owners remove

    def _no_bridge_netfilter(self) -> None:
        """Turn br_netfilter off for the hub namespace's bridge, where that is per namespace."""
        release = tuple(int(x) for x in re.findall(r"\d+", platform.release())[:2])
        if release < (5, 3):  # the sysctl was global before 5.3: leave the host's setting alone
            return
        subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                self.hub_ns,
                "sh",
                "-c",
                "f=/proc/sys/net/bridge/bridge-nf-call-iptables; [ ! -e $f ] || echo 0 > $f",
            ],
            capture_output=True,
        )

    # --- processes -------------------------------------------------------------------------------

    def node_command(self, node: int, argv: list[str]) -> list[str]:
        """The command line that runs `argv` on node `node`: in its network namespace, with its
        hostname (a UTS namespace of its own) and /etc/hosts (and its /dev/shm, if private).

        `ip netns exec` and `unshare` (without --fork) both exec, so the pid of the command started
        is that of `argv` itself: engine pids are those of the Popen objects."""
        # ip netns exec runs in a fresh mount namespace (recursively slave): a bind stays there
        binds = self.private_dirs(node)
        script = 'hostname "$0"'
        script += "".join(f' && mount --bind "${2 * k + 1}" "${2 * k + 2}"' for k in range(len(binds)))
        script += f' && shift {2 * len(binds)} && exec "$@"'
        extra = [path for pair in binds for path in pair]
        return [
            "ip",
            "netns",
            "exec",
            self.node_ns[node],
            "unshare",
            "--uts",
            "sh",
            "-c",
            script,
            self.hostnames[node],
            *extra,
            *argv,
        ]

    def private_dirs(self, node: int) -> list[tuple[str, str]]:
        """(a directory of this machine, the path it is mounted over on node ``node``): what the node
        has of its own, as a separate machine would (its /dev/shm, if private)."""
        return [(str(self.shm_dirs[node]), "/dev/shm")] if self.private_shm else []

    def run_in_node(self, node: int, argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """Run a command on node `node` and wait for it (`subprocess.run`), e.g. to probe the node."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(self.node_command(node, argv), **kwargs)

    def _spawn(self, name: str, cmd: list[str]) -> subprocess.Popen[bytes]:
        assert self.tmpdir is not None
        log = self.tmpdir / "log" / f"{name}.log"
        log.parent.mkdir(exist_ok=True)
        with open(log, "wb") as out:
            p = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=_child_env(),
                cwd=self.tmpdir,
                start_new_session=True,
            )
        self._procs.append((name, p, log))
        return p

    def _start(self) -> None:
        self.tmpdir = Path(tempfile.mkdtemp(prefix="nbspawn-netns-"))
        profile = self.tmpdir / "profile"
        cluster_id = "nbs"
        (profile / "security").mkdir(parents=True)  # engines, started with the controller, need it at once
        self._make_network()
        self.url_file = str(profile / "security" / f"ipcontroller-{cluster_id}-client.json")
        common = [f"--profile-dir={profile}", f"--cluster-id={cluster_id}", "--log-level=INFO"]
        self._spawn(
            "controller",
            [
                "ip",
                "netns",
                "exec",
                self.hub_ns,
                sys.executable,
                "-m",
                "ipyparallel.controller",
                *common,
                f"--ip={self.controller_address}",
                f"--location={self.controller_address}",
                *_HEARTBEAT_ARGS,
            ],
        )
        engine_ready = self.tmpdir / "engine.json"
        node_pids = {}
        for i in range(self.nodes):
            for j in range(self.engines_per_node):
                p = self._spawn(
                    f"node{i}-engine{j}",
                    self.node_command(
                        i,
                        [
                            sys.executable,
                            "-m",
                            "ipyparallel.engine",
                            *common,
                            f"--file={engine_ready}",
                            f"--IPEngine.wait_for_url_file={self.timeout}",
                        ],
                    ),
                )
                node_pids[p.pid] = i
        engine_json = profile / "security" / f"ipcontroller-{cluster_id}-engine.json"
        self._wait_for_engines(node_pids, self._check_alive, engine_json, engine_ready)

    def _check_alive(self) -> None:
        for name, p, log in self._procs:
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited ({p.returncode}) while starting:\n{_tail(log)}")

    def _logs(self) -> str:
        return "\n".join(f"--- {name} ---\n{_tail(log, 20)}" for name, _, log in self._procs)

    def processes(self) -> list[psutil.Process]:
        procs = []
        for ns in self._made_ns:
            for pid in _netns_pids(ns):
                with contextlib.suppress(psutil.Error):
                    procs.append(psutil.Process(pid))
        return [p for p in procs if _running(p)]

    def _stop(self) -> None:
        problems = []
        for _, p, _ in self._procs:
            with contextlib.suppress(OSError):
                os.killpg(p.pid, signal.SIGKILL)
        for ns in self._made_ns:
            stuck = _kill_netns(ns)
            if stuck:
                problems.append(f"processes in {ns} survived SIGKILL: {stuck}")
        for _, p, _ in self._procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)
        # deleting one end of a veth deletes the other; doing it here (rather than leaving it to the
        # namespace's asynchronous destruction) means the link is really gone when close() returns
        if _ip("link", "show", self.root_link, check=False).returncode == 0:
            r = _ip("link", "del", self.root_link, check=False)
            if r.returncode:
                problems.append(f"ip link del {self.root_link}: {r.stderr.strip()}")
        for ns in reversed(self._made_ns):
            r = _ip("netns", "del", ns, check=False)
            if r.returncode:
                problems.append(f"ip netns del {ns}: {r.stderr.strip()}")
        for etc in self._made_dirs:
            shutil.rmtree(etc, ignore_errors=True)
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
        _live_tags.discard(self.tag)
        if problems:
            raise RuntimeError("NetnsNodes teardown: " + "; ".join(problems))
