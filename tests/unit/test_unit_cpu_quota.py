"""CPUs a process may use under a cgroup CPU quota (nbspawn/_machine.usable_cpus, issue 30, item 3):
docker ``--cpus`` and hosted notebook runtimes give a quota, not fewer cores, so ``-n auto`` and the
ranks' OMP_NUM_THREADS must read the quota too.  The cgroup trees here are simulated in files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nbspawn._machine import cgroup_cpu_quota, usable_cpus

AFFINITY = len(os.sched_getaffinity(0))


def _tree(tmp_path: Path, cgroup: str, files: dict[str, str]) -> tuple[str, str]:
    """A /proc/self/cgroup with ``cgroup`` and a /sys/fs/cgroup holding ``files`` (path -> content)."""
    proc = tmp_path / "cgroup"
    proc.write_text(cgroup)
    root = tmp_path / "sys"
    root.mkdir()
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return str(proc), str(root)


@pytest.mark.parametrize(
    ("cgroup", "files", "quota"),
    [
        # v2 in a container (docker --cpus=1.5): its own cgroup is the root it sees
        ("0::/\n", {"cgroup.controllers": "cpu\n", "cpu.max": "150000 100000\n"}, 1.5),
        ("0::/\n", {"cgroup.controllers": "cpu\n", "cpu.max": "max 100000\n"}, None),
        # v2, nested: the tightest of the cgroup and those above it
        (
            "0::/user.slice/job\n",
            {"cgroup.controllers": "", "user.slice/cpu.max": "200000 100000", "user.slice/job/cpu.max": "max 100000"},
            2.0,
        ),
        (
            "0::/user.slice/job\n",
            {"cgroup.controllers": "", "user.slice/cpu.max": "400000 100000", "user.slice/job/cpu.max": "25000 50000"},
            0.5,
        ),
        # v2: the path names a cgroup outside the container's view; its root is the container's cgroup
        ("0::/kubepods/pod1/ctr\n", {"cgroup.controllers": "", "cpu.max": "300000 100000"}, 3.0),
        # v1 (cpu and cpuacct mounted together), a docker cgroup
        (
            "5:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n",
            {"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "50000\n", "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n"},
            0.5,
        ),
        ("5:cpu,cpuacct:/\n", {"cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"}, None),
        # v1 with cpu mounted on its own, beside v2 at unified/ (hybrid, as on this project's machines)
        (
            "1:cpu:/job\n2:cpuacct:/\n0::/\n",
            {"unified/cgroup.controllers": "", "cpu/job/cpu.cfs_quota_us": "250000", "cpu/job/cpu.cfs_period_us": "100000"},
            2.5,
        ),
        # garbage and missing files: no quota
        ("0::/\n", {"cgroup.controllers": "", "cpu.max": "lots\n"}, None),
        ("0::/\n", {}, None),
    ],
)
def test_cgroup_cpu_quota(tmp_path, cgroup, files, quota):
    assert cgroup_cpu_quota(*_tree(tmp_path, cgroup, files)) == quota


def test_no_cgroup_file_means_no_quota(tmp_path):
    assert cgroup_cpu_quota(str(tmp_path / "none"), str(tmp_path)) is None
    assert usable_cpus(str(tmp_path / "none"), str(tmp_path)) == AFFINITY


@pytest.mark.parametrize(("cpu_max", "usable"), [("150000 100000", 2), ("100000 100000", 1), ("1000 100000", 1)])
def test_usable_cpus_is_the_quota_rounded_up_at_least_one(tmp_path, cpu_max, usable):
    paths = _tree(tmp_path, "0::/\n", {"cgroup.controllers": "", "cpu.max": cpu_max})
    assert usable_cpus(*paths) == min(AFFINITY, usable)


def test_usable_cpus_never_exceeds_the_cpus_it_may_run_on(tmp_path):
    paths = _tree(tmp_path, "0::/\n", {"cgroup.controllers": "", "cpu.max": f"{(AFFINITY + 10) * 100000} 100000"})
    assert usable_cpus(*paths) == AFFINITY


def test_this_machine():
    """The real files: whatever they say, the count is between 1 and the CPUs this process may use."""
    assert 1 <= usable_cpus() <= AFFINITY
