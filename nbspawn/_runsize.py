"""The run-size checks: ranks a user named at the door (``--ranks``, ``--on``: read there by
``nbspawn._options``, which cannot know how many ranks there will be), checked once a planner knows the
run's or the world's size."""

from __future__ import annotations

from .errors import SpawnUsageError


def on_within(on: frozenset[int] | None, nprocs: int, world: str) -> frozenset[int] | None:
    """``--on``, read at the door, checked against world ``world`` of ``nprocs`` ranks; None where it
    names every rank."""
    if on is None:
        return None
    checked = ranks_within(on, nprocs, "--on", f"world {world!r} of {nprocs} ranks") or frozenset()
    return None if len(checked) == nprocs else checked


def ranks_within(ranks: frozenset[int] | None, nprocs: int, option: str, where: str) -> frozenset[int] | None:
    """Ranks read at the door, each a rank of ``where`` (``nprocs`` ranks): no parsing, the one check
    that needs to know how many ranks there are."""
    if ranks is None:
        return None
    bad = sorted(r for r in ranks if not 0 <= r < nprocs)
    if bad:
        raise SpawnUsageError(f"{option}: rank {bad[0]} does not exist in {where} (0-{nprocs - 1})")
    return ranks
