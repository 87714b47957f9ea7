"""Unit tests of the error.json records a rank leaves, in nbspawn's format and in torch elastic's (a
program's ``@record``), written and read by their one owner (nbspawn._errorfile), and of a log's last
lines (_last_lines), what a failed program with no record is described by. No kernel, no processes."""

from __future__ import annotations

import json

import pytest
from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

from nbspawn import _errorfile
from nbspawn._errorfile import ErrorRecord
from nbspawn.executors._supervisor import _last_lines


def _fields(record: ErrorRecord | None) -> dict | None:
    """The fields the supervisor uses, as a dict (None: no usable record)."""
    if record is None:
        return None
    return {"exc_type": record.exc_type, "message": record.message, "traceback": record.traceback}


def _error_record(data: object) -> dict | None:
    return _fields(ErrorRecord.from_json(data))


def test_nbspawns_own_record_is_taken_as_it_is():
    own = {"exc_type": "ValueError", "exc_module": "builtins", "message": "x", "traceback": "tb", "time": 1.0}
    assert ErrorRecord.from_json({"message": {"message": "ignored"}, "nbspawn": own}) == ErrorRecord(
        "ValueError", "x", "tb", 1.0, "builtins"
    )


def test_written_then_read_back_whole(tmp_path):
    """What a rank writes is what the kernel reads, and torch elastic's own fields are there too."""
    try:
        raise KeyError("k")
    except KeyError as exc:
        record = ErrorRecord.of(exc, "Traceback ...\nKeyError: 'k'")
    path = str(tmp_path / "error.json")
    _errorfile.write(path, record)
    assert _errorfile.read(path) == record
    on_disk = json.loads((tmp_path / "error.json").read_text())
    assert on_disk["message"]["message"] == "KeyError: 'k'"
    assert on_disk["message"]["extraInfo"]["py_callstack"] == "Traceback ...\nKeyError: 'k'"
    assert not (tmp_path / "error.json.tmp").exists()


def test_a_record_of_elastic_alone_is_never_first(tmp_path):
    """Among ranks that ended together the earliest record is the root cause: one without nbspawn's
    time sorts last."""
    assert ErrorRecord.from_json({"message": {"message": "E: m", "extraInfo": {"timestamp": "1"}}}).time == float("inf")


def test_unreadable_file_is_no_record(tmp_path):
    (tmp_path / "error.json").write_text("{half")
    assert _errorfile.read(str(tmp_path / "error.json")) is None
    assert _errorfile.read(str(tmp_path / "missing.json")) is None


def test_torch_elastics_record_from_its_own_error_handler(tmp_path, monkeypatch):
    """A program decorated with torch's @record writes this; its type, message and traceback are read."""
    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    try:
        raise ValueError("bad value: really")
    except ValueError as exc:
        ErrorHandler().record_exception(exc)
    record = _error_record(json.loads(path.read_text()))
    assert record["exc_type"] == "ValueError"
    assert record["message"] == "bad value: really"  # split at the first ": " only
    assert record["traceback"].startswith("Traceback (most recent call last):")
    assert record["traceback"].rstrip().endswith("ValueError: bad value: really")


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ({"message": "no colon here"}, {"exc_type": "no colon here", "message": "", "traceback": None}),
        ({"message": ""}, {"exc_type": "Error", "message": "", "traceback": None}),
        ({"message": ": only text", "extraInfo": None}, {"exc_type": "Error", "message": "only text", "traceback": None}),
        ({"message": "E: m", "extraInfo": {"py_callstack": "tb"}}, {"exc_type": "E", "message": "m", "traceback": "tb"}),
    ],
)
def test_torch_elastic_records_odd_and_partial(message, expected):
    assert _error_record({"message": message}) == expected


@pytest.mark.parametrize("record", [None, {}, {"message": "a plain string"}, {"other": 1}])
def test_no_usable_record(record):
    assert _error_record(record) is None


def test_last_lines_of_a_log(tmp_path):
    log = tmp_path / "stderr.log"
    log.write_text("".join(f"line {i}\n" for i in range(20)))
    assert _last_lines(str(log), 3) == "  line 17\n  line 18\n  line 19"
    log.write_text("")
    assert _last_lines(str(log), 3) == ""
    assert _last_lines(str(tmp_path / "missing.log"), 3) == ""
