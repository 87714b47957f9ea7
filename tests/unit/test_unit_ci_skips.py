"""Which skips fail a CI job (tests/ci_skips.py): a layer the project provides may not be skipped, a
part of the machine may."""

from __future__ import annotations

import ci_skips
import pytest


@pytest.mark.parametrize(
    ("reason", "job", "fails"),
    [
        ("nbspawn/_static/widget.js is not built", "dev", True),
        ("nbspawn/_static/widget.js is not built", "colab-gpu", True),  # the wheel every job installs has it
        ("the widget's front end is not built (make lab)", "kaggle-gpu", True),
        ("widget.js is not built", None, False),  # outside CI a missing part skips, as it always did
        ("playwright is not installed (pip install playwright; no browser download needed)", "colab-gpu", True),
        ("jupyterlab is not installed (pip install -e '.[lab]')", "dev", True),
        ("jupyterlab is not installed (pip install -e '.[lab]')", "colab-gpu", False),  # not on Colab's stack
        ("marimo is not installed (pip install -e '.[marimo]')", "dev", True),
        ("not installed: torch_lightning (the `frameworks` extra: ...)", "dev", True),
        ("not installed: ['ipywidgets']", "kaggle-gpu", True),
        ("this ipykernel has no subshells (ipykernel >= 7 has)", "dev", True),
        ("this ipykernel has no subshells (ipykernel >= 7 has)", "floor", True),  # 7.3 has them
        ("this ipykernel has no subshells (ipykernel >= 7 has)", "colab-gpu", False),
        ("needs the classic Notebook 6.x (found 7.4.0): the Colab runtime job runs it", "dev", False),
        ("needs the classic Notebook 6.x (found none): the Colab runtime job runs it", "colab-gpu", True),
        ("torch_xla is not installed (make runtime-tpu-cpu runs these)", "dev", False),
        ("torch_xla is not installed", "tpu-cpu", True),
        # the machine's: they stay skips, counted in CI's summary
        ("no memory control group this test can make (needs root and a memory controller)", "dev", False),
        ("needs two or more GPUs", "dev", False),
        ("this machine has no non-loopback address", "dev", False),
    ],
)
def test_a_skip_fails_ci_only_for_a_layer_the_project_provides_where_its_stack_has_it(reason, job, fails):
    why = ci_skips.refused(reason, job)
    assert (why is not None) == fails, why
    if fails:
        assert reason in why and job in why


def test_the_job_is_dev_under_ci_unless_named(monkeypatch):
    monkeypatch.delenv("NBSPAWN_CI_JOB", raising=False)
    monkeypatch.delenv("CI", raising=False)
    assert ci_skips.job() is None
    monkeypatch.setenv("CI", "true")
    assert ci_skips.job() == "dev"
    monkeypatch.setenv("NBSPAWN_CI_JOB", "floor")
    assert ci_skips.job() == "floor"


def test_a_skip_reason_is_read_from_pytests_report():
    assert ci_skips.skip_reason(("t.py", 3, "Skipped: widget.js is not built")) == "widget.js is not built"
