"""The package's imports run one way: from the doors down to the files a rank writes, never back up.

Every import counts, those inside functions and under ``TYPE_CHECKING`` too: a layer may import only
from layers below it (or from its own package), and no two modules import each other, directly or
round a loop.  docs/architecture.md draws the same floors.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "nbspawn"

# lowest first; a module's floor is that of its first matching prefix
FLOORS = [
    [
        "nbspawn._rankdir",
        "nbspawn._errorfile",
        "nbspawn._version",
        "nbspawn._shell",
        "nbspawn._comms",
        "nbspawn._hosted",
        "nbspawn._pids",
    ],
    ["nbspawn.errors"],
    [
        "nbspawn._source",
        "nbspawn._options",
        "nbspawn._program",
        "nbspawn._request",
        "nbspawn._cuda",
        "nbspawn._tpu",
        "nbspawn._listen",
        "nbspawn._clash",
        "nbspawn._capacity",
        "nbspawn._machine",
        "nbspawn._runsize",
    ],
    ["nbspawn.handoff"],
    ["nbspawn._spec"],
    ["nbspawn._decide"],
    ["nbspawn.events"],
    ["nbspawn.ranks"],
    ["nbspawn._runstate"],
    ["nbspawn.views"],
    ["nbspawn.executors"],
    ["nbspawn.cluster"],
    ["nbspawn.planning"],
    ["nbspawn._effects"],
    ["nbspawn._dispatch"],
    ["nbspawn._control"],
    ["nbspawn._api", "nbspawn._magic", "nbspawn._door"],
    ["nbspawn"],  # the package's __init__: the public names
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """The nbspawn modules ``path`` imports, anywhere in it."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("nbspawn"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("nbspawn"):
                continue
            for alias in node.names:  # `from . import _shm` imports a module
                candidate = f"{target}.{alias.name}"
                found.add(candidate if _exists(candidate) else target)
    found.discard(name)
    return found


def _exists(module: str) -> bool:
    relative = Path(*module.split(".")[1:])
    return (PACKAGE / relative).with_suffix(".py").exists() or (PACKAGE / relative / "__init__.py").exists()


def floor(module: str) -> int:
    best = -1
    for index, prefixes in enumerate(FLOORS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (best < 0 or len(prefix) > len(FLOORS[best][0])):
                best = index
    assert best >= 0, f"{module} is on no floor: add it to FLOORS"
    return best


def graph() -> dict[str, set[str]]:
    return {module_name(path): imports_of(path) for path in PACKAGE.rglob("*.py") if "labextension" not in path.parts}


def package_of(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2])


def test_every_module_has_a_floor():
    for module in graph():
        floor(module)


def test_no_import_climbs_a_floor():
    climbing = []
    for module, imported in graph().items():
        for target in imported:
            same_package = package_of(module) == package_of(target) and module != "nbspawn"
            if not same_package and floor(target) > floor(module):
                climbing.append(f"{module} (floor {floor(module)}) imports {target} (floor {floor(target)})")
    assert not climbing, "\n".join(sorted(climbing))


def test_no_import_cycle():
    edges = graph()
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(module: str, stack: list[str]) -> None:
        state[module] = 1
        for target in sorted(edges.get(module, ())):
            if target == "nbspawn" or target.endswith("__init__"):
                continue
            if state.get(target) == 1:
                cycles.append([*stack[stack.index(target) :], target] if target in stack else [module, target])
            elif target not in state:
                visit(target, [*stack, target])
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_the_checker_sees_an_upward_import(tmp_path):
    """A climbing import is found (the checker itself can fail)."""
    assert floor("nbspawn.views._text") > floor("nbspawn._runstate")
    assert "nbspawn._runstate" in imports_of(PACKAGE / "views" / "_text.py")
