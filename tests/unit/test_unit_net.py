"""Which interface carries a node's address (nbspawn/_listen.interface_of, issue 30, item 4):
every address of every interface counts, secondary IPv4 and IPv6 ones too, so GLOO_SOCKET_IFNAME /
NCCL_SOCKET_IFNAME are set on nodes whose route to node 0 does not leave from a primary IPv4 address."""

from __future__ import annotations

import socket

import psutil
import pytest

from nbspawn._listen import interface_of, interface_with
from nbspawn.cluster._net import source_address

# psutil's own entry type (its module moved between releases), taken from this machine's table
_ENTRY = type(next(entry for addresses in psutil.net_if_addrs().values() for entry in addresses))


def _addr(family: int, address: str):
    return _ENTRY(family, address, None, None, None)


# a node as psutil sees it: eth0 with a secondary IPv4 address and IPv6 ones, a bond with only IPv6
TABLE = {
    "lo": [_addr(socket.AF_INET, "127.0.0.1"), _addr(socket.AF_INET6, "::1")],
    "eth0": [
        _addr(socket.AF_INET, "10.0.0.5"),
        _addr(socket.AF_INET, "10.0.1.5"),  # secondary (ip addr add 10.0.1.5/24 dev eth0)
        _addr(socket.AF_INET6, "2001:db8::5"),
        _addr(socket.AF_INET6, "fe80::1%eth0"),
        _addr(psutil.AF_LINK, "02:42:ac:11:00:02"),
    ],
    "ib0": [_addr(socket.AF_INET, "192.168.7.5")],
    "bond0": [_addr(socket.AF_INET6, "fd00:1::5")],
}


@pytest.mark.parametrize(
    ("address", "name"),
    [
        ("10.0.0.5", "eth0"),
        ("10.0.1.5", "eth0"),  # a secondary address: the ioctl saw only 10.0.0.5
        ("2001:db8::5", "eth0"),
        ("2001:0db8:0000::0005", "eth0"),  # the same address written out
        ("fe80::1", "eth0"),  # the zone is not part of the address
        ("fe80::1%eth0", "eth0"),
        ("fd00:1::5", "bond0"),
        ("192.168.7.5", "ib0"),
        ("127.0.0.1", "lo"),
        ("10.0.0.6", None),
        ("02:42:ac:11:00:02", None),  # a MAC address is not an IP address
        ("", None),
    ],
)
def test_interface_with(address, name):
    assert interface_with(address, TABLE) == name


def test_every_address_of_this_machine_finds_its_interface():
    """The real table: each IP address of each interface here maps back to an interface holding it
    (IPv6 ones included, which the old ioctl never found)."""
    table = psutil.net_if_addrs()
    seen = 0
    for name, addresses in table.items():
        for entry in addresses:
            if entry.family in (socket.AF_INET, socket.AF_INET6):
                found = interface_of(entry.address)
                assert found is not None and entry.address in [a.address for a in table[found]], (name, entry.address)
                seen += 1
    assert seen >= 1


def test_the_route_to_a_peer_names_an_interface():
    """What _agent._socket_interface does on a node: the source address toward node 0, then its
    interface; here toward this machine's own non-loopback addresses, IPv4 and IPv6."""
    peers = [
        entry.address
        for name, addresses in psutil.net_if_addrs().items()
        for entry in addresses
        if name != "lo" and entry.family in (socket.AF_INET, socket.AF_INET6) and "%" not in entry.address
    ]
    if not peers:
        pytest.skip("this machine has no non-loopback address")
    for peer in peers:
        source = source_address(peer)
        assert source is not None and interface_of(source) is not None, (peer, source)
