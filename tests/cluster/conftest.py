"""The clusters every cluster test runs on, one of each per test module (a start costs seconds), and the
kernel connected to them: this folder's `kernel` is one that runs cells on the cluster."""

from __future__ import annotations

import pytest
from cluster_harness import connected_kernel
from cluster_nodes import LocalNodes, NetnsNodes, netns_skip_reason


@pytest.fixture(scope="module")
def nodes():
    """Two nodes of one engine each, on this machine (``NBSPAWN_NODE`` tells them apart)."""
    with LocalNodes(nodes=2, engines_per_node=1) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def kernel(nodes):
    with connected_kernel(nodes) as k:
        yield k


@pytest.fixture(scope="module")
def netns_nodes():
    """Two nodes in network namespaces of their own (as root; skipped where they cannot be made)."""
    reason = netns_skip_reason()
    if reason:
        pytest.skip(reason)
    # each node its own /dev/shm too: nothing may cross nodes through shared memory
    with NetnsNodes(nodes=2, engines_per_node=1, private_shm=True) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def netns_kernel(netns_nodes):
    with connected_kernel(netns_nodes) as k:
        yield k
