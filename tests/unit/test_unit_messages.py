"""The kernel's view messages (``nbspawn.views._messages``) and their TypeScript twins
(``labextension/src/messages.ts``) say the same: the same status tags, the same record fields.

A field or tag added on one side only is a view that shows nothing (or lies) for it; these read the
TypeScript source as it is, so either side changed alone fails here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

from nbspawn._runstate import RankStatus, RunStatus
from nbspawn.views._messages import RankRecord, Request, RunErrorRecord, RunRecord, StatusMessage

TS = (Path(__file__).resolve().parents[2] / "labextension" / "src" / "messages.ts").read_text()


def ts_union(name: str) -> set[str]:
    """The string tags of ``export type <name> = 'a' | 'b' ...;``."""
    found = re.search(rf"export type {name} =([^;]+);", TS)
    assert found, name
    return set(re.findall(r"'([^']*)'", found[1]))


def ts_fields(name: str) -> dict[str, bool]:
    """``export interface <name> { ... }``: each field's name, and whether it is optional (``?:``)."""
    found = re.search(rf"export interface {name} \{{(.*?)\n\}}", TS, re.S)
    assert found, name
    body = re.sub(r"/\*\*.*?\*/", "", found[1], flags=re.S)
    return {m[1]: m[2] == "?" for m in re.finditer(r"^\s+(\w+)(\??):", body, re.M)}


def test_status_tags_are_the_same_on_both_sides():
    assert set(get_args(RunStatus)) == ts_union("RunStatus")
    # a rank that sits a cell out (--on) is never in a run's record: the browser has no tag for it
    assert set(get_args(RankStatus)) - {"absent"} == ts_union("RankStatus")
    assert set(get_args(Request)) == ts_union("WidgetRequest")


def test_records_have_the_same_fields_on_both_sides():
    pairs = [
        (RankRecord, "IRankRecord", {"output"}),  # version 1 bundles only: read, never written
        (RunRecord, "IRunRecord", set()),
        (RunErrorRecord, "IRunErrorRecord", set()),
        (StatusMessage, "IRunStatus", set()),
    ]
    for python, typescript, read_only in pairs:
        fields = ts_fields(typescript)
        assert set(python.__annotations__) | _inherited(python) == set(fields) - read_only, typescript
        assert all(fields[name] for name in read_only), typescript  # optional: what older kernels never sent


def _inherited(typed: type) -> set[str]:
    return {name for base in typed.__mro__[1:] for name in getattr(base, "__annotations__", {})}


def test_the_parsers_see_what_is_there():
    """The helpers above read real declarations (a regex that matched nothing would pass vacuously)."""
    assert {"done", "failed"} <= ts_union("RankStatus")
    assert len(ts_fields("IRankRecord")) >= 15
