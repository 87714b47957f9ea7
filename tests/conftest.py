"""Kernel fixtures: real ipykernels started from this interpreter (see kernel_harness, which also
holds every helper the tests share: import them from there, never from this file or a test module)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import ci_skips
import pytest
import signal_trace
from kernel_harness import (
    loaded_kernel,
    private_shm_possible,
    run,
    settle_kernels,
    start_kernel,
    stop_kernel_later,
    stop_spare_kernel,
)

# pytest keeps its assertion-rewritten test modules only where bytecode may be written; these machines set
# PYTHONDONTWRITEBYTECODE, so each of a CI job's pytest processes (a phase, an xdist worker) rewrote every
# test module again: 3 of the 10 s a collection took. This process only (kernels and ranks keep the setting).
sys.dont_write_bytecode = False

# The fixtures that hold a kernel; a test with none of them may fork this very process (test_shm, the
# fork tests), so it waits for the kernels starting or stopping in a thread (kernel_harness._Spare,
# stop_kernel_later).
KERNEL_FIXTURES = {"kernel", "fresh_kernel", "plain_kernel", "netns_kernel"}


# nbspawn._options.START_METHODS, written out: importing nbspawn here would import torch (2.7 s) for
# every pytest run, a single unit-test file's too
START_METHODS = ("fork", "spawn", "forkserver")


_TRACING = pytest.StashKey[bool]()  # the controller turned the SIGTERM trace on


def pytest_sessionstart(session):
    """The session's controller records who sends SIGTERMs (``signal_trace``) where root can."""
    if not hasattr(session.config, "workerinput"):
        session.config.stash[_TRACING] = signal_trace.start()


def pytest_sessionfinish(session):
    if session.config.stash.get(_TRACING, False):
        signal_trace.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CI, a skip for a layer the project builds or installs itself fails the test (``ci_skips``)."""
    outcome = yield
    _refuse_provided_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """The same for a whole module skipped as it was collected (a module-level importorskip)."""
    outcome = yield
    _refuse_provided_skip(outcome.get_result())


def _refuse_provided_skip(report) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        why = ci_skips.refused(ci_skips.skip_reason(report.longrepr), ci_skips.job())
        if why is not None:
            report.outcome, report.longrepr = "failed", why


def pytest_addoption(parser):
    parser.addoption(
        "--start-methods",
        default=",".join(START_METHODS),
        help="run a test parametrized by start method (its `method`) only for these, comma-separated; the "
        "hosted runtimes' jobs run fork and forkserver, what a CPU and a GPU runtime start ranks with",
    )
    parser.addoption(
        "--spawn-runs-elsewhere",
        default="",
        metavar="MODULES",
        help="leave out the spawn variants (a test parametrized by start method, its `method` spawn) of these test "
        "modules, comma-separated paths: make test's, whose spawn variants CI's newest-torch job runs "
        "(the Makefile's SPAWN_AT_THE_NEWEST_TORCH)",
    )
    parser.addoption(
        "--phase",
        choices=("all", "parallel", "browser", "alone"),
        default="all",
        help="which tests to run by how much of the machine they need (scripts/pytest.sh runs the three in turn): "
        "`parallel`, the kernel and unit tests, on pytest-xdist's workers; `browser`, the browser tests, three "
        "at a time; `alone`, the tests marked `alone` (they time a page or a Stop, or compare what the whole "
        "machine holds), one at a time with nothing beside them",
    )


def phase_of(item: pytest.Item) -> str:
    """The phase (``--phase``) a test runs in: ``alone`` wins over ``browser``.

    ``@pytest.mark.alone(unless_private_shm=True)`` counts the segments in /dev/shm: where its kernel can
    have a /dev/shm of its own (root: CI), no other test's segments are there and it runs in the parallel
    phase.
    """
    alone = item.get_closest_marker("alone")
    if alone is not None and alone.kwargs.get("unless_private_shm", False) and private_shm_possible():
        alone = None  # a leak test whose kernel has a /dev/shm of its own (kernel_harness.start_kernel)
    if alone is not None:
        return "alone"
    return "browser" if item.get_closest_marker("browser") is not None else "parallel"


BROWSER_TESTS = "tests/browser/"


def may_hold(phase: str, path: Path, root: Path) -> bool:
    """Whether the test module at ``path`` may hold a test of ``phase`` (``--phase``), judged without
    importing it: the browser tests live in tests/browser/, and a module with a test that runs alone
    names the mark. The browser and alone phases collect only those modules (4.8 s of CPU each, where
    collecting every module imports the kernel and unit tests' modules too: 11.6 s a process, and the
    browser phase has a process a worker); the parallel phase collects them all, and fails a test
    that these rules would leave out of its phase (``misplaced``)."""
    if phase == "browser":
        return path.resolve().is_relative_to((root / BROWSER_TESTS).resolve())
    if phase == "alone":
        return "alone" in path.read_text(encoding="utf-8").lower()
    return True


def misplaced(item: pytest.Item) -> str | None:
    """Why ``item`` would not be collected in its own phase (``may_hold``), or None."""
    phase = phase_of(item)
    if phase in ("browser", "alone") and not may_hold(phase, item.path, item.config.rootpath):
        where = f"live in {BROWSER_TESTS}" if phase == "browser" else "name `alone` in their module"
        return f"{item.nodeid}: the {phase} phase would never collect it: its tests must {where}"
    return None


def pytest_ignore_collect(collection_path: Path, config):
    phase = config.getoption("--phase")
    module = collection_path.is_file() and collection_path.name.startswith("test_") and collection_path.suffix == ".py"
    if phase in ("browser", "alone") and module and not may_hold(phase, collection_path, config.rootpath):
        return True
    return None


def pytest_collection_modifyitems(config, items):
    wanted = set(config.getoption("--start-methods").split(","))
    if unknown := wanted - set(START_METHODS):
        raise pytest.UsageError(f"--start-methods: {', '.join(sorted(unknown))} is not one of {', '.join(START_METHODS)}")
    spawn_elsewhere = {p for p in config.getoption("--spawn-runs-elsewhere").split(",") if p}
    if missing := {p for p in spawn_elsewhere if not (config.rootpath / p).is_file()}:
        raise pytest.UsageError(f"--spawn-runs-elsewhere: no such test module: {', '.join(sorted(missing))}")
    phase = config.getoption("--phase")
    if phase in ("all", "parallel") and (wrong := [why for item in items if (why := misplaced(item))]):
        raise pytest.UsageError("\n".join(wrong))

    def method_left_out(item: pytest.Item) -> bool:
        method = getattr(item, "callspec", None) and item.callspec.params.get("method")
        if method not in START_METHODS:
            return False
        return method not in wanted or (method == "spawn" and module_path(item) in spawn_elsewhere)

    left_out = [item for item in items if method_left_out(item) or (phase != "all" and phase_of(item) != phase)]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        dropped = set(left_out)
        items[:] = [item for item in items if item not in dropped]
    items.sort(key=longest_first)  # stable: each module's tests keep their order


# The parallel phase's modules, longest first (seconds in the ci summary's JUnit report, 2026-12-01, a
# loaded machine): xdist's loadfile hands modules out in collection order (scripts/pytest.sh turns its
# reordering by test count off), so a long module handed out last ran alone at the end: the phase took
# as long as its last module's worker. Modules not listed follow, the kernel's and clusters' before the
# unit tests' (seconds each, against minutes).
LONGEST_FIRST = (
    "tests/kernel/test_rank_children.py",  # 507 s
    "tests/kernel/test_notebooks.py",  # 469 s
    "tests/kernel/test_shm.py",  # 277 s
    "tests/kernel/test_handoff.py",  # 269 s, its leak test included (now test_handoff_leaks.py)
    "tests/kernel/test_worlds.py",  # 168 s
    "tests/kernel/test_debugger.py",  # 163 s
    "tests/cluster/test_cluster.py",  # 163 s
    "tests/kernel/test_names.py",  # 152 s
    "tests/kernel/test_debug_magic.py",  # 144 s
    "tests/cluster/test_cluster_worlds.py",  # 123 s
    "tests/unit/test_unit_xray_html.py",  # 119 s
    "tests/kernel/test_spawn_core.py",  # 109 s
    "tests/kernel/test_where.py",  # 100 s
)


def module_path(item: pytest.Item) -> str:
    """The test's module as the command line names it from the repository root (tests/kernel/test_x.py)."""
    return item.path.relative_to(item.config.rootpath).as_posix() if item.path.is_relative_to(item.config.rootpath) else ""


def longest_first(item: pytest.Item) -> tuple[int, int]:
    """Where a test's module goes in the run's order (LONGEST_FIRST, then kernel and cluster, then unit)."""
    path = module_path(item)
    if path in LONGEST_FIRST:
        return (0, LONGEST_FIRST.index(path))
    return (1, 1 if path.startswith("tests/unit/") else 0)


@pytest.fixture(scope="session", autouse=True)
def _spare_kernel():
    yield
    stop_spare_kernel()


@pytest.fixture(autouse=True)
def _no_kernel_starting_under_a_test_without_one(request):
    if KERNEL_FIXTURES.isdisjoint(request.fixturenames):
        settle_kernels()


@pytest.fixture(scope="module")
def kernel():
    """One kernel per test module, with nbspawn loaded (kernel_harness.LOAD); tests must leave it usable."""
    k = loaded_kernel()
    yield k
    stop_kernel_later(k)


@pytest.fixture
def fresh_kernel():
    """A kernel of the test's own, with nbspawn loaded, for tests that interrupt or kill it."""
    k = loaded_kernel()
    yield k
    stop_kernel_later(k)


@pytest.fixture(scope="module")
def plain_kernel():
    """A kernel without nbspawn: tests the harness itself."""
    k = start_kernel()
    yield k
    stop_kernel_later(k)


@pytest.fixture
def world(kernel):
    """A fresh world name per test, for the module's kernel; whatever the test left is stopped after it."""
    name = f"w{time.monotonic_ns() % 10**8}"
    yield name
    run(kernel, f"%spawn stop {name}")
