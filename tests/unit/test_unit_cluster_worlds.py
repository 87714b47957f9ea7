"""Pure parts of worlds and background runs on a cluster: how a lost world is asked for again, and
which controller a background run holds."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from nbspawn._options import Given
from nbspawn._request import RunRequest, Settings
from nbspawn._source import CellSource
from nbspawn.cluster import _plan
from nbspawn.errors import SpawnUsageError
from nbspawn.executors._kept import Lost
from nbspawn.planning._kept_cell import as_before


def test_a_lost_worlds_next_cell_runs_where_and_as_it_did_unless_it_says_otherwise():
    lost = Lost("node 1 was lost", Settings(nprocs=2, backend="gloo", env={"A": "1"}, given=Given(nprocs=True)), "rc", 2)
    bare = as_before(RunRequest.of(CellSource("pass"), world="w"), lost)
    assert (bare.cluster, bare.nodes, bare.settings.nprocs, bare.settings.backend, bare.settings.env) == (
        "rc",
        2,
        2,
        "gloo",
        {"A": "1"},
    )
    own = as_before(
        RunRequest.of(
            CellSource("pass"), world="w", cluster="rc2", nodes=1, settings=Settings(nprocs=4, given=Given(nprocs=True))
        ),
        lost,
    )
    assert (own.cluster, own.nodes, own.settings.nprocs, own.settings.backend) == ("rc2", 1, 4, "gloo")


def test_a_background_run_holds_its_controllers_engines_until_released():
    client = SimpleNamespace(_config={"registration": "tcp://10.0.0.1:5000"})
    companion = SimpleNamespace(_config={"registration": "tcp://10.0.0.1:5000"})  # the same controller
    other = SimpleNamespace(_config={"registration": "tcp://10.0.0.2:5000"})
    _plan.hold(client, "run-1")
    try:
        with pytest.raises(SpawnUsageError, match="background run run-1 until it ends"):
            _plan.refuse_if_busy(companion)
        _plan.refuse_if_busy(other)  # another controller's engines are free
        _plan.release(client, "run-2")  # not the holder: nothing changes
        with pytest.raises(SpawnUsageError):
            _plan.refuse_if_busy(client)
    finally:
        _plan.release(client, "run-1")
    _plan.refuse_if_busy(client)


def test_a_nodes_run_counts_the_kernels_interrupts_and_raises_none_and_then_gives_sigint_back():
    import os
    import signal

    from nbspawn.cluster import _contact

    before = signal.getsignal(signal.SIGINT)
    with _contact.node_run():
        os.kill(os.getpid(), signal.SIGINT)  # the handler runs at the next bytecode: never a KeyboardInterrupt
        os.kill(os.getpid(), signal.SIGINT)
        assert _contact.interrupts_heard() == 2
        assert _contact.interrupts_heard() == 0  # each is taken once
        os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before
    with _contact.node_run():
        assert _contact.interrupts_heard() == 0  # the last run's untaken interrupt is not this one's


def test_a_signal_for_a_node_that_has_not_begun_waits_for_it_and_keeps_its_order():
    import signal

    from nbspawn.cluster import _contact
    from nbspawn.cluster._executor import ClusterRanks

    sent: list[tuple[int, list[int]]] = []
    ranks = ClusterRanks.__new__(ClusterRanks)  # the signalling alone: no engines
    ranks.cluster = SimpleNamespace(
        nodes=[SimpleNamespace(index=0, agent=10), SimpleNamespace(index=1, agent=11)],
        node_of=lambda rank: SimpleNamespace(index=rank // 2),
    )
    ranks.answered, ranks.asked, ranks.begun, ranks.held = {}, set(), {1}, {}
    ranks._send_signal = lambda sig, agents: sent.append((sig, agents))
    ranks.signal_ranks([0, 1, 2, 3], [], signal.SIGINT)
    assert sent == [(signal.SIGINT, [11])] and ranks.asked == {0, 1}
    ranks.signal_ranks([0, 1], [], signal.SIGTERM)
    ranks.signal_ranks([0, 1], [], signal.SIGKILL)
    assert len(sent) == 1
    ranks._began(0)
    assert sent[1:] == [(signal.SIGINT, [10]), (_contact.STOP_SIGNAL, [10]), (signal.SIGINT, [10])]
    ranks.signal_ranks([0], [], signal.SIGINT)
    assert sent[-1] == (signal.SIGINT, [10]) and len(sent) == 5
