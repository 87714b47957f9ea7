"""Kernel fixtures: real ipykernels started from this interpreter (see kernel_harness, which also
holds every helper the tests share: import them from there, never from this file or a test module)."""

from __future__ import annotations

import time

import pytest
from kernel_harness import loaded_kernel, run, start_kernel, stop_kernel


@pytest.fixture(scope="module")
def kernel():
    """One kernel per test module, with nbspawn loaded (kernel_harness.LOAD); tests must leave it usable."""
    k = loaded_kernel()
    yield k
    stop_kernel(k)


@pytest.fixture
def fresh_kernel():
    """A kernel of the test's own, with nbspawn loaded, for tests that interrupt or kill it."""
    k = loaded_kernel()
    yield k
    stop_kernel(k)


@pytest.fixture(scope="module")
def plain_kernel():
    """A kernel without nbspawn: tests the harness itself."""
    k = start_kernel()
    yield k
    stop_kernel(k)


@pytest.fixture
def world(kernel):
    """A fresh world name per test, for the module's kernel; whatever the test left is stopped after it."""
    name = f"w{time.monotonic_ns() % 10**8}"
    yield name
    run(kernel, f"%spawn stop {name}")
