"""A Slurm cluster of network-namespace nodes, as a Slurm login gives one: for the guide's Slurm recipe.

The nodes are `SshNodes`' (their own address, hostname, ~/.ipython and /tmp), each running Debian's
``slurmd`` too; ``slurmctld`` runs in this machine's own namespace on its address on the nodes'
network, with one ``munged`` (its socket a file, which every namespace reaches) authenticating them.
Slurm is told to leave control groups alone (``proctrack/linuxproc``, ``task/none``): this machine's
groups belong to the machine. Everything (configuration, state, spools, logs) lives in a directory of
the fixture's own, ``SLURM_CONF`` names its configuration: a kernel given `env` submits there.

    with SlurmNodes(nodes=2) as nodes:
        nodes.env                          # SLURM_CONF for sbatch, squeue, scancel (and a kernel)
        nodes.squeue()
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from ssh_nodes import SshNodes

SLURMCTLD = shutil.which("slurmctld") or "/usr/sbin/slurmctld"
SLURMD = shutil.which("slurmd") or "/usr/sbin/slurmd"
MUNGED = shutil.which("munged") or "/usr/sbin/munged"
MUNGE_KEY = Path("/etc/munge/munge.key")


def slurm_skip_reason() -> str | None:
    """Why a Slurm cluster cannot be made here (None when it can)."""
    missing = [p for p in (SLURMCTLD, SLURMD, MUNGED) if not Path(p).exists()] + [
        c for c in ("sbatch", "squeue", "scancel") if shutil.which(c) is None
    ]
    if missing or not MUNGE_KEY.exists():
        return f"no Slurm or munge ({', '.join(missing) or MUNGE_KEY}; apt-get install slurm-wlm munge)"
    return None


class SlurmNodes(SshNodes):
    """`nodes` nodes with slurmd each, a slurmctld here, one partition ``debug`` holding them all."""

    def __init__(self, nodes: int = 2, *, timeout: float = 60) -> None:
        super().__init__(nodes, timeout=timeout)
        self.env: dict[str, str] = {}
        """What a client of this cluster needs in its environment: ``SLURM_CONF``."""

    def _start(self) -> None:
        super()._start()
        assert self.tmpdir is not None
        slurm = self.tmpdir / "slurm"
        for d in ("state", "spool", "log"):
            (slurm / d).mkdir(parents=True)
        munge_socket = slurm / "munge.socket"
        self._spawn(
            "munged",
            [
                MUNGED,
                "--foreground",
                "--force",
                f"--socket={munge_socket}",
                f"--key-file={MUNGE_KEY}",
                f"--pid-file={slurm / 'munged.pid'}",
                f"--seed-file={slurm / 'munged.seed'}",
                f"--log-file={slurm / 'log' / 'munged.log'}",
            ],
        )
        port = _free_port(self.root_address)
        here = socket.gethostname()
        nodes = "".join(
            f"NodeName={name} NodeAddr={address} CPUs={os.cpu_count()} State=UNKNOWN\n"
            for name, address in zip(self.hostnames, self.addresses, strict=True)
        )
        conf = slurm / "slurm.conf"
        conf.write_text(
            f"ClusterName=nbs\nSlurmctldHost={here}({self.root_address})\nSlurmctldPort={port}\nSlurmdPort=6818\n"
            "SlurmUser=root\nSlurmdUser=root\nAuthType=auth/munge\nCredType=cred/munge\n"
            f"AuthInfo=socket={munge_socket}\n"
            f"StateSaveLocation={slurm / 'state'}\nSlurmdSpoolDir={slurm / 'spool'}/%n\n"
            f"SlurmctldPidFile={slurm / 'slurmctld.pid'}\nSlurmdPidFile={slurm / 'spool'}/%n.pid\n"
            "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nJobAcctGatherType=jobacct_gather/none\n"
            "AccountingStorageType=accounting_storage/none\nMpiDefault=none\nReturnToService=2\n"
            "SchedulerType=sched/backfill\nSelectType=select/cons_tres\nSelectTypeParameters=CR_Core\n"
            "SlurmdParameters=config_overrides\nInactiveLimit=0\nKillWait=5\n"
            f"{nodes}PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n"
        )
        # Slurm 22.05 loads a cgroup plugin whatever proctrack and task say; "autodetect" (the default)
        # fails in a node's namespace, which has no /sys/fs/cgroup. cgroup/v1 loads without touching
        # any group, and nothing configured here asks it for one.
        (slurm / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nIgnoreSystemd=yes\n")
        self.env = {"SLURM_CONF": str(conf)}
        deadline = time.monotonic() + self.timeout
        while not munge_socket.exists():
            self._check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"munged did not start:\n{self._logs()}")
            time.sleep(0.1)
        self._spawn("slurmctld", ["env", f"SLURM_CONF={conf}", SLURMCTLD, "-D", "-i"])
        for i in range(self.nodes):
            (slurm / "spool" / self.hostnames[i]).mkdir()
            self._spawn(
                f"node{i}-slurmd",
                self.node_command(i, ["env", f"SLURM_CONF={conf}", SLURMD, "-D", "-N", self.hostnames[i]]),
            )
        while True:
            states = self.sinfo()
            if len(states) == self.nodes and all(s.startswith("idle") for s in states.values()):
                break
            self._check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"the nodes did not come up in Slurm ({states}):\n{self._logs()}")
            time.sleep(0.3)

    def _client(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), capture_output=True, text=True, env={**os.environ, **self.env}, timeout=30)

    def sinfo(self) -> dict[str, str]:
        """Each node's state, as ``sinfo`` says it (``idle``, ``alloc``, ``down*``...)."""
        done = self._client("sinfo", "-h", "-N", "-o", "%N %T")
        return dict(line.split(None, 1) for line in done.stdout.splitlines() if line.strip()) if done.returncode == 0 else {}

    def squeue(self) -> list[str]:
        """The jobs queued or running: ``JOBID STATE REASON`` lines."""
        return self._client("squeue", "-h", "-o", "%i %T %r").stdout.splitlines()

    def scancel(self, job: str) -> None:
        self._client("scancel", job)

    def sbatch(self, *args: str) -> str:
        """Submit a job (its output nowhere, its directory the fixture's); returns its id."""
        assert self.tmpdir is not None
        done = self._client("sbatch", "--parsable", "--output=/dev/null", f"--chdir={self.tmpdir}", *args)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().split(";")[0]

    def job_state(self, job: str) -> str:
        """``STATE REASON`` of ``job`` as squeue says it ("" once it has left the queue)."""
        return self._client("squeue", "-h", "-j", job, "-o", "%T %r").stdout.strip()


def _free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])
