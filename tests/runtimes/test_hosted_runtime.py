"""A kernel that finds itself on Colab or Kaggle says once, at ``%load_ext nbspawn``, what differs there."""

from __future__ import annotations

import pytest
from kernel_harness import ok, start_kernel, stop_kernel


@pytest.mark.parametrize(
    ("variable", "value", "name"),
    [("COLAB_RELEASE_TAG", "release-colab_20260819", "Colab"), ("KAGGLE_KERNEL_RUN_TYPE", "Interactive", "Kaggle")],
)
def test_load_ext_says_once_what_differs_on_a_hosted_runtime(variable, value, name):
    kernel = start_kernel(env={variable: value})
    try:
        first = ok(kernel, "%load_ext nbspawn")
        lines = [line for line in first.stderr.splitlines() if line.startswith("nbspawn on ")]
        assert lines == [lines[0]] and lines[0].startswith(f"nbspawn on {name}: "), first.stderr
        again = ok(kernel, "%reload_ext nbspawn\n%load_ext nbspawn")
        assert "nbspawn on " not in again.stderr  # once per kernel
        result = ok(kernel, "%%spawn -n 2 --view text\nimport os\nprint('rank', os.environ['RANK'])")
        assert "rank 1" in result.stdout and "nbspawn on " not in result.stderr
    finally:
        stop_kernel(kernel)


def test_elsewhere_load_ext_says_nothing(plain_kernel):
    result = ok(plain_kernel, "%load_ext nbspawn")
    assert "nbspawn on " not in result.stderr + result.stdout
