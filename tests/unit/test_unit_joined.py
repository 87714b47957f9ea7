"""A rank whose cell is over leaves only once every peer has its process group (gloo's connect race)."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import pytest

from nbspawn.ranks import _cell

LATE = 1.0  # how long rank 1 takes to say it joined, after rank 0 is at its wait


def _rank(rank: int, port: int, out: str, destroyed_by_the_cell: bool, local: int | None = None) -> None:
    # the ranks join a store their launcher hosts, as nbspawn's ranks do (a rank that leaves takes no store along)
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2", TORCHELASTIC_USE_AGENT_STORE="True"
    )
    if rank == 1:  # a peer still busy making its group (gloo taking its connection) when rank 0 is done
        said = _cell._say_joined

        def late(dist):  # type: ignore[no-untyped-def]
            # once rank 0 is at its wait (a rank 0 that came later, a spawned process importing torch on a
            # loaded machine, would find rank 1 joined already, and its wait would be tested by nothing)
            deadline = time.monotonic() + 120
            while not Path(out, "0.waiting").exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(LATE)
            Path(out, "1.joined").write_text(str(time.time()))
            said(dist)

        _cell._say_joined = late  # type: ignore[assignment]
    dist = _cell.init_process_group("gloo", rank if local is None else local)
    assert dist is not None
    if destroyed_by_the_cell:  # the cell destroyed the group itself: the wait still holds
        dist.destroy_process_group()
    Path(out, f"{rank}.waiting").write_text(str(time.time()))
    _cell.wait_until_every_peer_joined()
    Path(out, f"{rank}.left").write_text(str(time.time()))
    if dist.is_initialized():
        dist.destroy_process_group()


def _ranks_context():
    """Forkserver: the ranks fork from a server that imported torch once, where spawned ones each
    imported it (2-3 s of CPU apiece, 20 s of the module's 29); never fork, which would copy the
    pytest worker's threads."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch.distributed", "nbspawn.ranks._cell"])
    return context


def _store(distributed):
    """A store on a port the system picks as it binds (a port found free and bound later can be taken
    meanwhile by another test's process: the Kaggle job once failed on EADDRINUSE); its port."""
    store = distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    return store, store.port


@pytest.mark.parametrize("destroyed_by_the_cell", [False, True])
def test_a_rank_leaves_only_once_every_peer_said_it_joined(tmp_path: Path, destroyed_by_the_cell: bool) -> None:
    distributed = pytest.importorskip("torch.distributed")
    store, port = _store(distributed)
    context = _ranks_context()
    ranks = [context.Process(target=_rank, args=(rank, port, str(tmp_path), destroyed_by_the_cell)) for rank in range(2)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(60)
    del store
    assert [process.exitcode for process in ranks] == [0, 0]
    joined = float((tmp_path / "1.joined").read_text())
    assert float((tmp_path / "0.left").read_text()) >= joined  # rank 0 was done at once, yet waited for rank 1


def test_a_rank_that_never_made_a_group_does_not_wait() -> None:
    import threading

    _cell._joined.clear()
    waiting = threading.Thread(target=_cell.wait_until_every_peer_joined, daemon=True)
    waiting.start()
    waiting.join(30)  # it returns at once: nothing to wait for (30 s: a hang guard)
    assert not waiting.is_alive(), "a rank with no group waited for peers"


def test_ranks_on_two_nodes_say_their_rank_in_the_world_not_on_their_node(tmp_path: Path) -> None:
    """A cluster's nodes each have a local rank 0: each must say it joined as the world knows it, or
    every rank waits for a rank 1 that never says so."""
    distributed = pytest.importorskip("torch.distributed")
    store, port = _store(distributed)
    context = _ranks_context()
    ranks = [context.Process(target=_rank, args=(rank, port, str(tmp_path), False, 0)) for rank in range(2)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(30)
    for process in ranks:
        if process.is_alive():
            process.kill()
    del store
    assert [process.exitcode for process in ranks] == [0, 0]
