"""Real-browser tests of the JupyterLab / Notebook 7 extension (labextension/): Chromium via Playwright."""

from __future__ import annotations

import importlib.util
import os
import shutil

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


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "browser: drives a real Chromium against a jupyter server (needs /usr/bin/chromium and playwright)",
    )
