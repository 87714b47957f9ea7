"""The door's one reading of a run's options: what ``%%spawn`` and ``launch()`` were given becomes a
typed, frozen :class:`~nbspawn._request.RunRequest`.

Both doors call :func:`read_settings` and :func:`read_request`, and nothing else calls a
``nbspawn._options`` parser: each value is read once, here, into what it means (``-n`` a count or
``"auto"``, ``--backend GLOO`` ``"gloo"``, seconds a float, ``--env`` a dict, rank lists sets), and a
malformed one is a :class:`~nbspawn.errors.SpawnUsageError` before anything is planned.  The planners
take these values as they are; what only they can check (``--ranks`` against the run's size, ``-n
auto`` on this machine, a kept world's own settings) they check without reading anything again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._options import (
    parse_accelerator,
    parse_backend,
    parse_env,
    parse_kb,
    parse_nodes,
    parse_nprocs,
    parse_on,
    parse_ranks,
    parse_seconds,
    parse_start_method,
    parse_world_name,
)
from ._request import Given, RunRequest, Settings
from ._source import CellSource
from .handoff._names import parse_names


def read_settings(
    *,
    nprocs: Any,
    start_method: str | None,
    backend: str | None,
    accelerator: str | None = None,
    env: list[str] | tuple[str, ...] | Mapping[str, str] | None,
    timeout: Any,
    grace_period: Any,
    log_dir: str | None,
    ranks: Any,
    max_saved_kb: Any = 256,
    max_image_kb: Any = 2048,
    pdb: bool = False,
    given: Given,
) -> Settings:
    """The run's options, each read once (a default already filled in where the user gave none;
    None for ``start_method``, ``backend``, ``timeout``: auto, none, no limit)."""
    n = parse_nprocs(nprocs)
    user_env = parse_env(env)
    method = parse_start_method(start_method)
    seconds = parse_seconds(timeout, "--timeout", allow_zero=False)
    grace = parse_seconds(grace_period, "--grace-period", allow_zero=True)
    saved_kb = parse_kb(max_saved_kb, "SpawnMagics.max_saved_kb")
    image_kb = parse_kb(max_image_kb, "SpawnMagics.max_image_kb")
    shown = parse_ranks(ranks)
    return Settings(
        nprocs=n,
        start_method=method,
        backend=parse_backend(backend),
        accelerator=parse_accelerator(accelerator),
        env=user_env,
        timeout=seconds,
        grace_period=5.0 if grace is None else grace,
        log_dir=log_dir or None,
        ranks=shown,
        max_saved_kb=saved_kb,
        max_image_kb=image_kb,
        pdb=pdb,
        given=given,
    )


def read_request(
    *,
    cell: CellSource | None,
    program: tuple[str, ...] | None,
    settings: Settings,
    world: str | None = None,
    on: Any = None,
    cluster: str | None = None,
    nodes: Any = None,
    namespace: dict[str, Any],
    hidden: Mapping[str, Any] | None = None,
    share: str | list[str] | tuple[str, ...] | None = None,
    out: str | list[str] | tuple[str, ...] | None = None,
    background: bool = False,
    cell_numbers: Mapping[str, int] | None = None,
) -> RunRequest:
    """The request, its options read: what runs, where, and how (``settings``, from :func:`read_settings`)."""
    return RunRequest(
        cell=cell,
        program=program,
        world=None if world is None else parse_world_name(world),
        on=parse_on(on),
        cluster=cluster,
        nodes=parse_nodes(nodes),
        settings=settings,
        namespace=namespace,
        hidden=hidden,
        share=parse_names(share, "--share"),
        out=parse_names(out, "--out"),
        background=background,
        cell_numbers=cell_numbers or {},
    )
