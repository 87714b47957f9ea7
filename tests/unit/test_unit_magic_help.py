"""``%%spawn?`` and ``launch()``'s docstring are made from one table (nbspawn._options.OPTIONS): every
option, and every form of the magic, is in the help; a program's parser refuses a cell's options
itself; and the checks a request gets before anything starts say one line each, whichever door it
came through. No kernel, no processes."""

from __future__ import annotations

import inspect
from dataclasses import replace

import pytest
from IPython.core.error import UsageError

from nbspawn import _listen
from nbspawn._api import _API_ONLY, launch
from nbspawn._dispatch import plan_run, refuse_combinations
from nbspawn._door import read_request, read_settings
from nbspawn._effects import carry_out
from nbspawn._magic import FORMS, SpawnMagics, _parsed
from nbspawn._options import OPTIONS, Given
from nbspawn._program import read_program_line
from nbspawn._request import RunRequest, Settings
from nbspawn._source import CellSource
from nbspawn.errors import SpawnUsageError

HELP = SpawnMagics.spawn.__doc__ or ""


@pytest.mark.parametrize("option", OPTIONS, ids=lambda o: o.flags[-1])
def test_every_option_is_in_the_magics_help(option):
    assert option.flags[-1] in HELP
    assert option.help.split()[0] in HELP


@pytest.mark.parametrize(
    "form",
    ["%%spawn [options]", "%spawn [options] -- PROGRAM", "%spawn status", "%spawn stop [NAME|RUN-ID", "%spawn show [RUN-ID]"],
)
def test_every_form_is_in_the_magics_help(form):
    assert form in FORMS
    assert form in HELP


def test_every_parameter_of_launch_is_documented():
    doc = launch.__doc__ or ""
    for name in inspect.signature(launch).parameters:
        assert f"\n    {name}: " in doc, name


def test_launch_documents_each_option_as_the_magic_does():
    doc = launch.__doc__ or ""
    for option in OPTIONS:
        if option.param in inspect.signature(launch).parameters and option.param not in _API_ONLY:
            assert f"{option.param}: {option.help}" in doc


@pytest.mark.parametrize(
    ("line", "refused"),
    [
        ("--share x", "--share does not apply to a program: a program's ranks cannot map"),
        ("--out y", "--out does not apply to a program"),
        ("--world w", "--world does not apply to a program"),
        ("--backend gloo", "--backend does not apply to a program: a program sets up its own process group"),
        ("--start-method fork", "--start-method does not apply to a program"),
        ("--fresh", "--fresh does not apply to a program"),
    ],
)
def test_a_programs_parser_refuses_cell_options(line, refused):
    with pytest.raises(UsageError, match=refused):
        _parsed(SpawnMagics._program_form, f"-n 2 {line}")


def test_a_programs_parser_takes_the_common_options():
    args = _parsed(SpawnMagics._program_form, "-n 2 --env A=1 B=2 --timeout 3 --bg")
    assert (args.nprocs, args.env, args.timeout, args.background) == ("2", ["A=1", "B=2"], "3", True)


@pytest.mark.parametrize(
    ("line", "env", "log_dir"),
    [
        ('--env MSG="hello world"', ["MSG=hello world"], None),
        ("--env NCCL_DEBUG='INFO' A=1", ["NCCL_DEBUG=INFO", "A=1"], None),
        ("--log-dir '/tmp/my logs'", None, "/tmp/my logs"),
        ('--log-dir "/tmp/it\'s"', None, "/tmp/it's"),
    ],
)
def test_a_line_is_read_as_a_shell_reads_it(line, env, log_dir):
    for magic in (SpawnMagics.spawn, SpawnMagics._program_form):
        args = _parsed(magic, f"-n 2 {line}")
        assert (args.env, args.log_dir) == (env, log_dir)


def test_an_unclosed_quote_is_a_usage_error():
    with pytest.raises(UsageError, match="cannot read this line: No closing quotation"):
        _parsed(SpawnMagics.spawn, '-n 2 --env MSG="hello')


def cell(**fields):
    """A cell's request with these options, made when called: what cannot be combined is refused as
    the request is made (RunRequest.of), or by the dispatch (refuse_combinations)."""
    return lambda: RunRequest.of(CellSource("pass"), **fields)


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (lambda: RunRequest.of(read_program_line(["x.py"]), share=("t",)), "--share does not apply to a program"),
        (
            lambda: RunRequest.of(read_program_line(["x.py"]), settings=Settings(backend="gloo", given=Given(backend=True))),
            "--backend does not apply to a program",
        ),
        (cell(nodes=2), "--nodes needs --cluster"),
        (cell(cluster="rc", world="w", background=True), "--bg runs on fresh ranks"),
        (cell(world="w", background=True), "--bg runs on fresh ranks"),
    ],
)
def test_what_cannot_be_combined_is_refused_in_one_line(request_, message):
    with pytest.raises(SpawnUsageError, match=message) as caught:
        refuse_combinations(request_())
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"nprocs": 0}, "--nprocs must be a positive integer"),
        ({"start_method": "thread"}, "--start-method must be one of"),
        ({"backend": "mpi"}, "--backend must be one of"),
        ({"env": ("NOEQUALS",)}, "--env expects KEY=VALUE"),
        ({"timeout": "-1"}, "--timeout must be more than zero"),
        ({"nprocs": 2, "ranks": "5"}, "--ranks: rank 5 does not exist"),  # read at the door, checked by the plan
    ],
)
def test_a_bad_option_is_refused_before_anything_starts(given, message, tmp_path):
    """Read at the door (``nbspawn._door``) or, for what only the plan knows (the run's size), planned:
    either way one line, and nothing made."""
    log_dir = tmp_path / "logs"
    raw = {"nprocs": "auto", "start_method": None, "backend": None, "env": None, "timeout": None}
    raw |= {"grace_period": 5.0, "ranks": None, "log_dir": str(log_dir), **given}
    with pytest.raises(SpawnUsageError, match=message):
        plan_run(read_request(cell=CellSource("pass"), program=None, settings=read_settings(**raw, given=Given()), namespace={}))
    assert not log_dir.exists()  # nothing was made on disk


def test_a_good_request_is_a_frozen_spec(tmp_path):
    spec, executor = carry_out(
        plan_run(replace(cell(settings=Settings(nprocs=2, start_method="spawn", log_dir=str(tmp_path)))(), rich=True))
    )
    _listen.release(spec.master_port)
    assert (spec.nprocs, spec.start_method, spec.rich) == (2, "spawn", True)
    assert spec.run_dir.startswith(str(tmp_path))
    with pytest.raises(AttributeError):
        spec.nprocs = 3  # type: ignore[misc]
    assert type(executor).__name__ == "FreshRanks"
