"""What runs in this kernel now, said and stopped: ``%spawn status``, ``%spawn stop`` and ``%spawn
where`` over kept worlds (on this machine and on clusters) and background runs."""

from __future__ import annotations

import time

from .errors import SpawnUsageError


def stop(names: list[str]) -> list[str]:
    """Stop these worlds and background runs (all of them if no name is given)."""
    from ._dispatch import kept_worlds, stop_worlds
    from .executors._kept import lost
    from .executors._registry import background_runs

    runs = background_runs()
    _known_or_refused(names, runs, [*kept_worlds(), *(n for n in names if lost(n) is not None)])
    worlds = [n for n in names if n not in runs]
    chosen = [runs[n] for n in names if n in runs] if names else [r for r in runs.values() if not r.done]
    stopped = stop_worlds(worlds or None) if worlds or not names else []
    for run in chosen:
        run.stop(by="%spawn stop")
    for run in chosen:
        run.ended_within(None)
        stopped.append(run.run_id)
    return stopped


def _known_or_refused(names: list[str], runs: dict, worlds: list[str]) -> None:
    """A name that is neither a background run's id nor one of ``worlds`` is refused in one line that
    names both kinds (``%spawn stop`` takes either), before anything is stopped or looked at."""
    unknown = [n for n in names if n not in runs and n not in worlds]
    if unknown:
        known = ", ".join([*worlds, *(r for r, run in runs.items() if not run.done)]) or "none"
        raise SpawnUsageError(f"no background run or kept world named {unknown[0]!r} (running: {known})")


def _kept_worlds() -> dict:
    from ._dispatch import kept_worlds

    return kept_worlds()


def shown_on_world(world: str, expression: str) -> dict[str, object]:
    """``%spawn show WORLD NAME``: what NAME holds on each rank of the kept world, drawn (a DTensor's
    shards as pictures of the global tensor, rank by rank)."""
    from .executors._show import check_expression, describe_on_world
    from .views._shards_html import shown_bundle

    found = _kept_worlds().get(world)
    if found is not None and found.on_cluster:
        from .cluster._clusterworld import ClusterWorld

        assert isinstance(found, ClusterWorld)
        check_expression(expression)
        answers = found.describe(expression)
    else:
        answers = describe_on_world(world, expression)
    if all("missing" in answer for answer in answers):
        raise SpawnUsageError(f"world {world!r} has no {expression} on any rank: {answers[0]['missing']}")
    return shown_bundle(world, expression, answers)


def shown(names: list[str]) -> dict[str, object]:
    """``%spawn show [RUN-ID]``: the frozen view of the last run (or of this background run), to draw
    again where a reload before JupyterLab's autosave lost it, as the kernel still holds the run;
    ``%spawn show WORLD NAME`` (or ``%spawn show NAME`` with one kept world): :func:`shown_on_world`."""
    from .executors._registry import background_runs, last_run

    if len(names) > 2:
        raise SpawnUsageError(
            "%spawn show takes a run id (none: the last run), or a kept world and a name: %spawn show WORLD NAME"
        )
    runs = background_runs()
    last = last_run()
    if last is not None:
        runs.setdefault(last.run_id, last)
    if len(names) == 2:
        return shown_on_world(names[0], names[1])
    if names and names[0] not in runs:
        worlds = [name for name, world in _kept_worlds().items() if not world.on_cluster]
        if len(worlds) == 1:  # one kept world: %spawn show NAME is that world's NAME
            return shown_on_world(worlds[0], names[0])
    if names and names[0] not in runs:
        known = ", ".join(runs) or "none"
        raise SpawnUsageError(f"no run {names[0]!r} to show (this kernel holds: {known})")
    run = runs[names[0]] if names else last
    if run is None:
        raise SpawnUsageError("no run to show: nothing has run in this kernel yet")
    if not run.done:
        raise SpawnUsageError(f"run {run.run_id} is still running: its live view is in the cell that started it")
    if run.shown is None:
        raise SpawnUsageError(f"run {run.run_id} was not shown as a view (--view text or none); its logs: {run.run_dir}")
    return run.shown


def where(names: list[str]) -> str:
    """Every rank's stack now, of these background runs and worlds (all running ones if none is named)."""
    from ._dispatch import kept_worlds
    from .executors._registry import background_runs

    runs, worlds = background_runs(), kept_worlds()
    _known_or_refused(names, runs, list(worlds))
    chosen_runs = [runs[n] for n in names if n in runs] if names else [r for r in runs.values() if not r.done]
    chosen_worlds = [worlds[n] for n in names if n in worlds] if names else list(worlds.values())
    parts = []
    for run in chosen_runs:
        if run.done:
            parts.append(f"run {run.run_id}: {run.status}, nothing runs (its logs: {run.run_dir})")
            continue
        elapsed = time.time() - run.started_at
        text = run.where()
        parts.append(f"run {run.run_id} (background, {elapsed:.0f} s):\n{text or '  (no rank is running)'}")
    parts.extend(world.where() for world in chosen_worlds)  # a cluster world's nodes' agents look at theirs
    return "\n\n".join(parts) or "nothing is running in the background, and there is no kept world"


def status_table() -> str:
    """Kept worlds and background runs, one line each."""
    from ._dispatch import kept_worlds
    from .executors._registry import background_runs

    worlds, runs = kept_worlds(), background_runs()
    if not worlds and not runs:
        return "no kept worlds or background runs (%%spawn --world NAME, %%spawn --bg)"
    rows = [("name", "kind", "ranks", "state", "cells/elapsed", "pids", "logs")]
    for world in worlds.values():
        s = world.status()
        pids = ",".join(map(str, s["pids"]))
        rows.append(
            (
                s["name"],
                s.get("kind") or f"world {s['start_method']}/{s['backend']}",
                str(s["ranks"]),
                s["state"],
                f"{s['cells']} cells",
                pids,
                s["logs"],
            )
        )
    for run in runs.values():
        elapsed = (run.ended_at or time.time()) - run.started_at
        pids = ",".join(str(r.pid) for r in run.ranks if r.status == "running")
        what = "program" if run.spec.program else "cell"
        rows.append((run.run_id, f"background {what}", str(run.nprocs), run.status, f"{elapsed:.0f} s", pids or "-", run.run_dir))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    table = "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1] for r in rows)
    from .executors._debug import waiting_lines

    return table + "".join(f"\n{line}" for line in waiting_lines())
