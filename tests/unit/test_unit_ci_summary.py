"""The summary that closes CI's log (scripts/ci_summary.py): a red CI says why in its last lines."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_spec = importlib.util.spec_from_file_location("ci_summary", Path(__file__).parents[2] / "scripts" / "ci_summary.py")
assert _spec and _spec.loader
ci_summary = importlib.util.module_from_spec(_spec)
sys.modules["ci_summary"] = ci_summary  # its dataclasses look their module up
_spec.loader.exec_module(ci_summary)

REPORT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" time="12.5">
<testcase classname="tests.browser.test_output_view" name="test_flood[nb7]" time="9">
  <failure message="AssertionError: typing 27 characters took 8.68 s&#10;assert 8.68 &lt; 8">long text</failure></testcase>
<testcase classname="tests.kernel.test_a" name="test_ok" time="1"/>
<testcase classname="tests.kernel.test_a" name="test_gpu" time="0"><skipped message="needs two or more GPUs"/></testcase>
<testcase classname="tests.kernel.test_a" name="test_setup" time="0"><error message="failed on setup with &quot;OSError: port&quot;"/></testcase>
</testsuite></testsuites>"""


def test_each_failure_is_named_with_its_phase_and_first_line_and_the_count_closes(tmp_path):
    (tmp_path / "dev-browser.xml").write_text(REPORT)
    (tmp_path / "dev.job").write_text("1 812")
    lines, ok = ci_summary.summary(tmp_path)
    assert not ok
    assert lines[-3:] == [
        "ci: FAILED [dev-browser] tests/browser/test_output_view.py::test_flood[nb7]: AssertionError: typing 27 characters took 8.68 s",
        'ci: FAILED [dev-browser] tests/kernel/test_a.py::test_setup: failed on setup with "OSError: port"',
        "ci: 1 passed, 2 failed, 1 skipped",
    ]
    assert "      1  needs two or more GPUs" in lines
    assert "ci: jobs: dev FAILED (exit 1) in 812 s" in lines


def test_a_job_that_failed_before_its_tests_is_a_failure_too(tmp_path):
    (tmp_path / "floor.job").write_text("1 40")
    (tmp_path / "dev.job").write_text("0 900")
    lines, ok = ci_summary.summary(tmp_path)
    assert not ok
    assert lines[-2].startswith("ci: FAILED: job floor exited 1 (no test report")
    assert lines[-1] == "ci: 0 passed, 1 failed, 0 skipped"


def test_all_green(tmp_path):
    (tmp_path / "dev-parallel.xml").write_text(REPORT.split("<testcase", 1)[0] + "</testsuite></testsuites>")
    (tmp_path / "dev.job").write_text("0 900")
    lines, ok = ci_summary.summary(tmp_path)
    assert ok and lines[-1] == "ci: 0 passed, 0 failed, 0 skipped"
