"""Real-browser tests of the JupyterLab / Notebook 7 extension (labextension/): Chromium via Playwright."""

from __future__ import annotations


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "browser: drives a real Chromium against a jupyter server (needs /usr/bin/chromium and playwright)",
    )
