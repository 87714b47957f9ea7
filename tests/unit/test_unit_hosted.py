"""Which hosted runtime the kernel is on, and the one line ``%load_ext nbspawn`` says there."""

from __future__ import annotations

from nbspawn._hosted import hosted_runtime, notice


def test_colab_is_known_by_its_release_tag_or_its_module():
    assert hosted_runtime({"COLAB_RELEASE_TAG": "release-colab_20260819"}, {}) == "colab"
    assert hosted_runtime({}, {"google.colab": object()}) == "colab"


def test_kaggle_is_known_by_its_run_type():
    assert hosted_runtime({"KAGGLE_KERNEL_RUN_TYPE": "Interactive"}, {}) == "kaggle"


def test_elsewhere_nothing_is_said():
    assert hosted_runtime({"HOME": "/root"}, {}) is None
    assert notice(None, {}) is None


def test_the_notice_is_one_line_naming_the_runtime_and_what_differs():
    for host in ("colab", "kaggle"):
        line = notice(host, {})
        assert line is not None
        assert "\n" not in line
        assert line.startswith(f"nbspawn on {host.capitalize()}: ")
        assert "static HTML" in line
    assert "custom widget manager" in (notice("colab", {}) or "")
    assert "PCIe" in (notice("kaggle", {}) or "")


def test_a_tpu_runtime_is_told_its_ranks_take_a_chip_each():
    line = notice("colab", {"COLAB_TPU_ADDR": "10.0.0.2:8470"}) or ""
    assert "one rank per chip" in line and "before using an XLA device in the kernel" in line
    assert "PCIe" not in (notice("kaggle", {"TPU_ACCELERATOR_TYPE": "v5litepod-8"}) or "")
