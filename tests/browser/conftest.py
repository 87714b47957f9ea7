"""Real-browser tests of the JupyterLab / Notebook 7 extension (labextension/): Chromium via Playwright."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest

# Locally a missing Chromium or Playwright skips these tests with a reason; in CI they must run.
if os.environ.get("CI"):
    _chromium = os.environ.get("NBSPAWN_CHROMIUM", "/usr/bin/chromium")
    _missing = [
        what
        for what, present in [
            (f"Chromium at {_chromium}", os.access(_chromium, os.X_OK) or shutil.which(_chromium)),
            ("the playwright package", importlib.util.find_spec("playwright")),
        ]
        if not present
    ]
    if _missing:
        raise RuntimeError(f"CI must run the browser tests, but {' and '.join(_missing)} is missing")


# The fixtures of every browser test; the helpers they use are tests/browser/lab_harness.py's, imported
# here only when a fixture runs: importing lab_harness skips a test module without playwright or
# jupyterlab, which a conftest must not do.


@pytest.fixture(scope="module")
def artifacts() -> Path:
    """Where screenshots go: test-artifacts/browser/ (NBSPAWN_TEST_ARTIFACTS overrides test-artifacts/)."""
    from lab_harness import ARTIFACTS

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


@pytest.fixture(scope="session")
def browser(tmp_path_factory):
    """Chromium (NBSPAWN_CHROMIUM, default /usr/bin/chromium) driven by Playwright, one per test process (an
    xdist worker runs many modules), as one browser context with a profile on disk: Chromium keeps the
    code it compiled for a page's scripts there, and JupyterLab's next page runs without compiling them
    again (4.4 s of CPU a page instead of 6.0). Each test's pages are its own (lab_harness.Page), and
    closed when it ends; every page opens its notebook in a workspace of its own."""
    from lab_harness import ACTION_TIMEOUT_MS, CHROMIUM, CHROMIUM_ARGS, NAVIGATION_TIMEOUT_MS, sync_api

    with sync_api.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            tmp_path_factory.mktemp("chromium-profile"),
            executable_path=CHROMIUM,
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 1000},
            color_scheme="light",
        )
        context.set_default_timeout(ACTION_TIMEOUT_MS)  # hang guards (lab_harness)
        context.set_default_navigation_timeout(NAVIGATION_TIMEOUT_MS)
        yield context
        context.close()


@pytest.fixture(scope="session", autouse=True)
def _shared_servers():
    """The JupyterLab and Notebook 7 servers lab_harness.serve shares between this process's modules,
    stopped at its end."""
    yield
    harness = sys.modules.get("lab_harness")
    if harness is not None:
        harness.stop_shared_servers()


@pytest.fixture
def page(browser):
    """A fresh page that records dialogs and console errors (lab_harness.Page)."""
    from lab_harness import Page

    p = Page(browser)
    yield p
    p.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed browser test's report ends with what its ``page`` fixture's page showed (a test's own
    ``with Page`` prints that itself) and the log of each jupyter server running then: what the kernel
    printed to its stderr (a warning of nbspawn's, a traceback) is there and nowhere else."""
    outcome = yield
    report = outcome.get_result()
    page = getattr(item, "funcargs", {}).get("page")
    if report.when == "call" and report.failed and page is not None:
        report.sections.append(("what the page showed as the test failed", page.what_was_open()))
    harness = sys.modules.get("lab_harness")
    if report.failed and harness is not None:
        for server in harness.RUNNING:
            report.sections.append((f"jupyter {server.app} server log (its end)", harness.log_tail(server)))
