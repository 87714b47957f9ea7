"""Kernel fixtures: real ipykernels started from this interpreter (see kernel_harness)."""

from __future__ import annotations

import pytest
from kernel_harness import Kernel, execute, start_kernel, stop_kernel

# `import nbspawn` too, so cells can call nbspawn.last_run() as they would after the README's setup.
# Runs show as `[rank{r}]: ` text lines, which tests read from stdout; in a Jupyter kernel the default
# is the live widget (tests/test_view_widget.py covers it, asking for it with --view widget).
LOAD = "%load_ext nbspawn\nimport nbspawn\n%config SpawnMagics.view = 'text'"


def _with_nbspawn(kernel: Kernel) -> Kernel:
    result = execute(kernel.client, LOAD, timeout=120)  # the first import of torch is slow on a cold disk
    if result.status != "ok":
        stop_kernel(kernel)
        pytest.fail(f"{LOAD!r} failed in the kernel:\n{result.error_text}{result.stderr}", pytrace=False)
    return kernel


@pytest.fixture(scope="module")
def kernel():
    """One kernel per test module, with nbspawn loaded; tests must leave it usable."""
    k = _with_nbspawn(start_kernel())
    yield k
    stop_kernel(k)


@pytest.fixture
def fresh_kernel():
    """A kernel of the test's own, with nbspawn loaded, for tests that interrupt or kill it."""
    k = _with_nbspawn(start_kernel())
    yield k
    stop_kernel(k)


@pytest.fixture(scope="module")
def plain_kernel():
    """A kernel without nbspawn: tests the harness itself."""
    k = start_kernel()
    yield k
    stop_kernel(k)
