import pytest

from nbspawn._shellreplies import strands_requests


@pytest.mark.parametrize(
    ("version", "strands"),
    [
        ("7.0.0", True),
        ("7.0.0a1", True),
        ("7.3.0", True),
        ("7.4.0", False),
        ("7.10.1", False),
        ("6.17.1", False),
        ("8.0.0", False),
        ("", False),
    ],
)
def test_only_ipykernel_7_0_to_7_3_strands_requests(version, strands):
    assert strands_requests(version) is strands
