"""Nodes reached over SSH, as people who outgrow one machine reach theirs: for the guide's SSH recipe.

Each node is a `NetnsNodes` namespace (its own address, hostname and /etc/hosts) running a real
OpenSSH server (Debian's ``openssh-server``) on its address, with an IPython directory
(/root/.ipython) and a /tmp of its own, as a separate machine has: ipyparallel's SSH launcher
copies the connection files into the node's profile directory and starts ``ipengine`` there, and
nothing a node writes there lands where the kernel or the other nodes would read it.  The rest of
the file system is this machine's (the same Python and packages on every node, as a cluster's
shared software).  Nothing starts engines or a controller here: the recipe under test does,
from a kernel in the root namespace (`recipe_config` is the part of a user's ``~/.ssh/config`` the
recipe relies on: the key, and the host keys accepted).

    with SshNodes(nodes=2) as nodes:
        nodes.addresses        # the hosts to name in SSHEngineSetLauncher.engines
        nodes.root_address     # the kernel's address on the nodes' network: the controller's ip
        nodes.ssh_config       # ssh -F this
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from cluster_nodes import NetnsNodes, _tail

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
IPYTHON_DIR = Path("/root/.ipython")  # root's, whom the nodes are logged in as


def ssh_skip_reason() -> str | None:
    """Why the SSH recipe cannot run here (None when it can): no sshd (apt-get install openssh-server)."""
    if not Path(SSHD).exists() or shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        return "no OpenSSH server or client (apt-get install openssh-server openssh-client)"
    return None


class SshNodes(NetnsNodes):
    """`nodes` network-namespace nodes, each with sshd on port 22 of its address and a private
    ~/.ipython and /tmp."""

    def __init__(self, nodes: int = 2, *, timeout: float = 60) -> None:
        super().__init__(nodes, 1, timeout=timeout)
        self.ssh_config = ""
        """An ``ssh -F`` file: the key the nodes accept, their host keys taken on first sight."""
        self.ipython_dirs: list[Path] = []
        self.tmps: list[Path] = []

    def private_dirs(self, node: int) -> list[tuple[str, str]]:
        if not self.ipython_dirs:  # before _start made them: nothing of its own yet
            return super().private_dirs(node)
        own = [(str(self.ipython_dirs[node]), str(IPYTHON_DIR)), (str(self.tmps[node]), "/tmp")]
        return [*super().private_dirs(node), *own]

    def _start(self) -> None:
        # not under /tmp: a node's own /tmp is mounted over it, and its sshd reads its files from here
        self.tmpdir = Path(tempfile.mkdtemp(prefix="nbspawn-ssh-", dir="/var/tmp"))
        self._make_network()
        key = self.tmpdir / "id_ed25519"
        _keygen(key)
        config = self.tmpdir / "ssh_config"
        config.write_text(
            f"Host *\n  User root\n  IdentityFile {key}\n  IdentitiesOnly yes\n  StrictHostKeyChecking no\n"
            "  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n  BatchMode yes\n"
        )
        self.ssh_config = str(config)
        Path("/run/sshd").mkdir(exist_ok=True)  # Debian's sshd wants its privilege separation directory
        IPYTHON_DIR.mkdir(exist_ok=True)  # where each node's own is mounted
        for i in range(self.nodes):
            node = self.tmpdir / f"node{i}"
            ipython, tmp = node / "ipython", node / "tmp"
            ipython.mkdir(parents=True)
            tmp.mkdir(mode=0o1777)
            tmp.chmod(0o1777)
            (node / "authorized_keys").write_text(key.with_suffix(".pub").read_text())
            self.ipython_dirs.append(ipython)
            self.tmps.append(tmp)
            host_key = node / "ssh_host_ed25519_key"
            _keygen(host_key)
            sshd_config = node / "sshd_config"
            sshd_config.write_text(
                f"ListenAddress {self.addresses[i]}\nPort 22\nHostKey {host_key}\nPidFile none\n"
                "PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
                f"AuthorizedKeysFile {node / 'authorized_keys'}\nUsePAM no\nStrictModes no\nPrintMotd no\n"
                "Subsystem sftp internal-sftp\n"
            )
            self._spawn(f"node{i}-sshd", self.node_command(i, [SSHD, "-D", "-e", "-f", str(sshd_config)]))
        deadline = time.monotonic() + self.timeout
        for i, address in enumerate(self.addresses):
            while not _listening(address, 22):
                self._check_alive()
                if time.monotonic() > deadline:
                    raise RuntimeError(f"node{i}'s sshd does not listen on {address}:22:\n{self._logs()}")
                time.sleep(0.1)

    def ssh(self, node: int, command: str) -> subprocess.CompletedProcess[str]:
        """Run ``command`` on node ``node`` over SSH, as the recipe's launcher does."""
        return subprocess.run(
            ["ssh", "-F", self.ssh_config, self.addresses[node], command], capture_output=True, text=True, timeout=30
        )

    def log(self, node: int) -> str:
        return _tail(self.tmpdir / "log" / f"node{node}-sshd.log") if self.tmpdir else ""


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)


def _listening(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False
