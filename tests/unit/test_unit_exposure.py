"""Where nbspawn listens (nbspawn._listen) and what a forked rank lets go of (nbspawn.ranks._fds),
each on the real thing: a real TCPStore, a real fork."""

from __future__ import annotations

import os
import socket
import tempfile

import pytest
from kernel_harness import listening

from nbspawn import _listen
from nbspawn._request import Settings
from nbspawn._spec import Placement
from nbspawn.ranks import _fds


@pytest.mark.parametrize(
    ("version", "takes"),
    [("2.4.1+cu121", False), ("2.7.0", False), ("2.8.0", True), ("2.13.0+cpu", True), ("3.0.0a0", True), ("weird", True)],
)
def test_libuv_store_takes_a_socket_from_torch_2_8(version, takes):
    assert _listen.libuv_takes_listen_fd(version) is takes


@pytest.mark.parametrize("libuv", [True, False])
def test_the_store_listens_on_its_address_only_and_clients_reach_it(monkeypatch, libuv):
    from datetime import timedelta

    import torch
    from torch.distributed import TCPStore

    if libuv and not _listen.libuv_takes_listen_fd(torch.__version__):
        pytest.skip(f"torch {torch.__version__}'s libuv server takes no listen fd (torch >= 2.8 does)")
    monkeypatch.setattr(_listen, "libuv_takes_listen_fd", lambda version: libuv)  # both servers where this torch has them
    port = _listen.reserve(_listen.LOOPBACK)
    assert listening(os.getpid()) and (_listen.LOOPBACK, port) in listening(os.getpid()).values()  # held from the start
    store = _listen.host_store(_listen.LOOPBACK, port)
    try:
        assert store.libuvBackend is libuv
        client = TCPStore(_listen.LOOPBACK, port, is_master=False, timeout=timedelta(seconds=10))
        client.set("key", "value")
        assert store.get("key") == b"value"
        ours = [address for address, p in listening(os.getpid()).values() if p == port]
        assert ours == [_listen.LOOPBACK], ours  # not *:PORT
    finally:
        del store


def test_a_port_no_longer_held_is_bound_again_on_its_address():
    port = _listen.reserve(_listen.LOOPBACK)
    _listen._held.pop(port).close()
    store = _listen.host_store(_listen.LOOPBACK, port)
    assert [a for a, p in listening(os.getpid()).values() if p == port] == [_listen.LOOPBACK]
    del store


def test_reserved_ports_are_bounded():
    ports = [_listen.reserve(_listen.LOOPBACK) for _ in range(_listen.HELD_PORTS + 3)]
    assert len(_listen._held) <= _listen.HELD_PORTS
    assert ports[-1] in _listen._held and ports[0] not in _listen._held  # the oldest let go


def test_ranks_on_one_machine_use_loopback_unless_the_user_chose(tmp_path):
    from fake_machine import machine, spec_on

    assert _listen.loopback_interface()  # Linux: lo (what Machine.here() tells the planner)
    settings = Settings(nprocs=2, backend="gloo", log_dir=str(tmp_path))
    env = spec_on(settings, machine(loopback="lo")).rank_env(0)
    assert env["GLOO_SOCKET_IFNAME"] == "lo" and env["NCCL_SOCKET_IFNAME"] == "=lo"
    assert env["MASTER_ADDR"] == "127.0.0.1" and env["TORCHELASTIC_USE_AGENT_STORE"] == "True"
    mine = Settings(nprocs=2, backend="gloo", log_dir=str(tmp_path), env={"GLOO_SOCKET_IFNAME": "eth9"})
    assert spec_on(mine, machine(user_env=dict(mine.env))).rank_env(0)["GLOO_SOCKET_IFNAME"] == "eth9"
    kernels = spec_on(settings, machine({"NCCL_SOCKET_IFNAME": "ib0"})).rank_env(0)
    assert "NCCL_SOCKET_IFNAME" not in kernels and kernels["GLOO_SOCKET_IFNAME"] == "lo"  # the kernel's own is inherited
    place = Placement(
        master_addr="10.0.0.1", master_port=29500, rank_offset=2, world_size=4, node_rank=1, nnodes=2, hosts_store=False
    )
    node = spec_on(settings, machine(), placement=place)  # a cluster node's
    assert "GLOO_SOCKET_IFNAME" not in node.rank_env(0)  # its agent sets the node's interface (cluster._agent)


def test_a_forked_child_lets_go_of_sockets_pipes_and_kernel_files_and_keeps_the_rest(tmp_path):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    read_end, write_end = os.pipe()
    users_file = open(tmp_path / "notes.txt", "w")  # noqa: SIM115 - the user's open file, kept in the child
    shm = tempfile.TemporaryFile(dir="/dev/shm") if os.path.isdir("/dev/shm") else tempfile.TemporaryFile()  # noqa: SIM115
    devnull = os.open(os.devnull, os.O_RDONLY)
    listed = _fds.kernel_descriptors()
    numbers = {fd for fd, _dev, _ino in listed}
    assert {server.fileno(), read_end, write_end} <= numbers
    assert not {users_file.fileno(), shm.fileno(), devnull} & numbers
    assert not {0, 1, 2} & numbers
    report_r, report_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the rank
        try:
            _fds.let_go(tuple(d for d in listed if d[0] != report_w))
            targets = [os.readlink(f"/proc/self/fd/{fd}") for fd in (server.fileno(), read_end, write_end)]
            os.write(report_w, "|".join(targets).encode())
            users_file.write("from the rank\n")
            users_file.flush()
        finally:
            os._exit(0)
    os.close(report_w)
    os.waitpid(pid, 0)
    said = os.read(report_r, 4096).decode().split("|")
    assert said == ["/dev/null"] * 3, said  # let go of, and the numbers stay taken
    assert (tmp_path / "notes.txt").read_text() == "from the rank\n"
    for fd in (read_end, write_end, report_r, devnull):
        os.close(fd)
    server.close()
    users_file.close()
    shm.close()


def test_a_number_reused_since_the_kernel_listed_it_is_left_alone():
    read_end, write_end = os.pipe()
    listed = tuple(d for d in _fds.kernel_descriptors() if d[0] == read_end)
    os.close(read_end)
    again, other = os.pipe()  # takes the same number: it is not the kernel's any more
    assert again == read_end
    _fds.let_go(listed)
    assert os.readlink(f"/proc/self/fd/{again}").startswith("pipe:")
    for fd in (again, other, write_end):
        os.close(fd)
