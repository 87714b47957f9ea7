"""Getting the kernel's names to ranks that start from a clean interpreter (spawn, forkserver).

A forked rank simply has the kernel's namespace.  A spawned one gets only the names its cell uses,
pickled *by value* with cloudpickle, because functions and classes defined in a notebook live in
``__main__``, which a fresh interpreter cannot import (pytorch#20375).  Anything that cannot be
shipped is named, with its type, before a single process starts.
"""

from __future__ import annotations

import ast
import builtins
import types
from typing import Any

import cloudpickle

from .errors import SpawnUsageError

# What IPython puts in every namespace; shipping these would drag the shell along.
_IPYTHON_NAMES = frozenset({"In", "Out", "get_ipython", "exit", "quit", "open", "_", "__", "___"})


def names_used(tree: ast.Module) -> set[str]:
    """Names the cell reads anywhere, nested functions and comprehensions included.

    A name the cell only ever assigns needs nothing from the kernel, so it is left out: the kernel's
    old value of it might not even be picklable.
    """
    loaded: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Store):
            loaded.add(node.id)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            loaded.update(node.names)
    return loaded


def _shippable(name: str, value: Any, hidden: dict[str, Any]) -> bool:
    if name in _IPYTHON_NAMES or name.startswith("__") or name in vars(builtins):
        return False
    if name in hidden and hidden[name] is value:  # IPython's own _i1, _oh... unless the user rebound it
        return False
    return not isinstance(value, types.ModuleType) or value.__name__ != "builtins"


def pack_namespace(tree: ast.Module, user_ns: dict[str, Any], hidden: dict[str, Any] | None = None) -> bytes:
    """Pickle the kernel names the cell uses; raise a short error naming any that can't travel."""
    hidden = hidden or {}
    wanted = {
        name: user_ns[name]
        for name in sorted(names_used(tree))
        if name in user_ns and _shippable(name, user_ns[name], hidden)
    }
    try:
        return cloudpickle.dumps(wanted)
    except Exception:  # noqa: BLE001 - find which name, then say so
        pass
    for name, value in wanted.items():
        try:
            cloudpickle.dumps(value)
        except Exception as err:  # noqa: BLE001
            kind = f"{type(value).__module__}.{type(value).__qualname__}"
            raise SpawnUsageError(
                f"cannot send {name!r} (a {kind}) to spawned ranks: {err}. "
                f"Create it inside the cell, or use --start-method fork."
            ) from None
    raise SpawnUsageError("cannot send the cell's names to spawned ranks (pickling failed)")


def unpack_namespace(payload: bytes) -> dict[str, Any]:
    return cloudpickle.loads(payload)
