"""``--xray values``: each rank's small tensors before and after each collective (``ranks._xray_values``),
lined up across the ranks, for teaching: ``[1] [2] [3] [4] -> all_reduce -> [10] [10] [10] [10]``.

:func:`line_up` is pure: the ranks' records (rank -> the JSON of its ``xray_values.json``, read by
:func:`read_values`) become one :class:`ValueRow` per collective, in the order the ranks called them.

* A collective is one (group, call number): every member of a group calls its collectives in the same
  order, and each rank numbers its calls per group.  Ranks that called different ops at one number
  (a mismatch, which ``events._xray`` names) are all shown, their ops joined (``all_reduce/all_gather``).
* A send and its receive are one row: a rank's k-th send to a peer and the peer's k-th receive from
  it (``send/recv 0→1``, the sender's input, the receiver's output).
* A tensor is ``{"shape", "dtype", "values"}`` (values only for one of 64 elements or fewer), a list
  of tensors (all_gather's output) a list of those, and None where the call had none (a scatter's
  input on a rank that is not its source).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .._rankdir import RankDir


@dataclass(frozen=True)
class ValueRow:
    """One collective (or a send and its receive): each rank's tensors before it and after it."""

    op: str  # "all_reduce"; "send/recv" for a point-to-point pair
    seq: int  # its number in its group, from 1 (a pair: the k-th between its two ranks)
    inputs: Mapping[int, Any]  # global rank -> a tensor, a list of them, or None
    outputs: Mapping[int, Any]
    group: str = ""  # the process group's name (the default group: "0")
    detail: str = ""  # what else the call said: "sum", "src 0", "dst 2", "0→1"
    notes: tuple[str, ...] = field(default=())  # "rank 1 raised", "async: ..."


def read_values(rank_dirs: Mapping[int, str]) -> dict[int, dict[str, Any]]:
    """Each rank's record (its global rank -> the JSON of its ``xray_values.json``), for the ranks that
    wrote one; one unreadable is left out."""
    records: dict[int, dict[str, Any]] = {}
    for rank, rank_dir in rank_dirs.items():
        try:
            with open(RankDir(rank_dir).xray_values, encoding="utf-8") as fh:
                record = json.load(fh)
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and isinstance(record.get("calls"), list):
            records[int(record.get("rank", rank))] = record
    return records


def beyond(records: Mapping[int, Mapping[str, Any]]) -> int:
    """The most calls a rank made past what it recorded (its first ``max_calls``)."""
    return max((int(record.get("beyond", 0) or 0) for record in records.values()), default=0)


def line_up(
    records: Mapping[int, Mapping[str, Any]], numbers: Mapping[tuple[str, int], int] | None = None
) -> tuple[ValueRow, ...]:
    """The ranks' calls side by side, one :class:`ValueRow` per collective or pair, in the order the
    lowest rank that made it called it.  ``numbers``: (group, call number) -> torch's number of the
    call's first collective (``XRay.numbers``): a collective's row is numbered as the drawing, the hang
    verdicts and Where? number it (a kept world's later cell: its first all_reduce is torch's #46, not #1)."""
    numbers = numbers or {}
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    order: dict[tuple[Any, ...], tuple[int, int]] = {}
    for rank, record in sorted(records.items()):
        for index, call in enumerate(record.get("calls") or []):
            if not isinstance(call, Mapping):
                continue
            key, role = _key(rank, call)
            if key is None:
                continue
            row = rows.setdefault(key, {"ops": [], "inputs": {}, "outputs": {}, "details": [], "notes": []})
            order.setdefault(key, (index, rank))
            op = "send/recv" if key[0] == "p2p" else str(call.get("op", "?"))
            if op not in row["ops"]:
                row["ops"].append(op)
            if role in ("both", "send"):
                row["inputs"][rank] = call.get("in")
            if role in ("both", "recv"):
                row["outputs"][rank] = call.get("out")
            detail = _detail(call, key)
            if detail and detail not in row["details"]:
                row["details"].append(detail)
            if call.get("raised"):
                row["notes"].append(f"rank {rank} raised")
            if call.get("note"):
                row["notes"].append(f"rank {rank}: {call['note']}")
    found = []
    for key in sorted(rows, key=lambda key: order[key]):
        row = rows[key]
        found.append(
            ValueRow(
                op="/".join(row["ops"]),
                seq=int(key[-1]) if key[0] == "p2p" else numbers.get((str(key[1]), int(key[-1])), int(key[-1])),
                inputs=dict(row["inputs"]),
                outputs=dict(row["outputs"]),
                group=str(key[1]),
                detail=", ".join(row["details"]),
                notes=tuple(row["notes"]),
            )
        )
    return tuple(found)


def _key(rank: int, call: Mapping[str, Any]) -> tuple[tuple[Any, ...] | None, str]:
    """Where a call goes: (group, number) for a collective, ("p2p", group, sender, receiver, number)
    for a send or a receive; and which side of the row it fills."""
    op, group, seq = str(call.get("op", "")), str(call.get("group", "")), int(call.get("seq", 0) or 0)
    if op in ("send", "isend"):
        peer = call.get("dst")
        return (("p2p", group, rank, int(peer), seq) if isinstance(peer, int) else None), "send"
    if op in ("recv", "irecv"):
        peer = call.get("src")
        return (("p2p", group, int(peer), rank, seq) if isinstance(peer, int) else None), "recv"
    return ("collective", group, seq), "both"


def _detail(call: Mapping[str, Any], key: tuple[Any, ...]) -> str:
    if key[0] == "p2p":
        return f"{key[2]}→{key[3]}"
    said = [str(call["reduce_op"])] if call.get("reduce_op") else []
    said += [f"{name} {call[name]}" for name in ("src", "dst") if isinstance(call.get(name), int)]
    return ", ".join(said)
