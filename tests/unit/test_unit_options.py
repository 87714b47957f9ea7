"""Unit tests of the option parsers in nbspawn._spec: the values they accept, and the one-line
SpawnUsageError each bad value gets (what a user reads). No kernel, no processes."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from nbspawn._decide import auto_nprocs
from nbspawn._options import (
    parse_backend,
    parse_env,
    parse_kb,
    parse_niceness,
    parse_nprocs,
    parse_on,
    parse_ranks,
    parse_seconds,
    parse_start_method,
    parse_xray,
)
from nbspawn._runsize import on_within, ranks_within
from nbspawn.errors import SpawnUsageError

# -- --ranks --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "nprocs", "expected"),
    [
        ("0,2", 4, {0, 2}),
        ("0-3", 4, {0, 1, 2, 3}),
        ("0-1,5,7", 8, {0, 1, 5, 7}),
        (" 1 - 2 , 3 ", 4, {1, 2, 3}),  # spaces anywhere
        ("1,1,1-1", 4, {1}),  # repeats collapse
        ("3", 4, {3}),  # the last rank
        ([2, 0], 4, {0, 2}),  # the Python API passes a list
        (["1", 3], 4, {1, 3}),
    ],
)
def test_ranks_accepted(value, nprocs, expected):
    shown = ranks_within(parse_ranks(value), nprocs, "--ranks", f"a run of {nprocs} ranks")
    assert shown == frozenset(expected)
    assert isinstance(shown, frozenset)


@pytest.mark.parametrize("value", [None, ""])
def test_ranks_unset_means_every_rank(value):
    assert parse_ranks(value) is None


@pytest.mark.parametrize("value", ["a", "1,", "0-", "-1", "1-x", "0,,1", "1.5"])
def test_ranks_malformed(value):
    with pytest.raises(SpawnUsageError) as err:
        parse_ranks(value)
    assert str(err.value) == f"--ranks expects a list like 0,2 or 0-3, not {value!r}"


@pytest.mark.parametrize(
    ("value", "nprocs", "first_bad"),
    [("4", 4, 4), ("0-4", 4, 4), ("0-3,9,7", 4, 7), ([5], 4, 5), ([-1, 0], 2, -1), ("1", 1, 1)],
)
def test_ranks_outside_the_run_name_the_lowest_bad_rank(value, nprocs, first_bad):
    with pytest.raises(SpawnUsageError) as err:
        ranks_within(parse_ranks(value), nprocs, "--ranks", f"a run of {nprocs} ranks")
    assert str(err.value) == f"--ranks: rank {first_bad} does not exist in a run of {nprocs} ranks (0-{nprocs - 1})"


def test_ranks_reversed_span_is_refused():
    with pytest.raises(SpawnUsageError, match="counts down; write 1-3"):
        parse_ranks("3-1")


# -- --on -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [("0", {0}), ("0,2-3", {0, 2, 3}), (" 1 ", {1}), ([2, 0], {0, 2}), ((3,), {3}), (1, {1})],  # launch(on=1)
)
def test_on_accepted(value, expected):
    assert on_within(parse_on(value), 5, "w") == frozenset(expected)


@pytest.mark.parametrize("value", [None, "0-3", [3, 2, 1, 0], "0,1,2,3,3"])
def test_on_every_rank_or_none_means_every_rank(value):
    assert on_within(parse_on(value), 4, "w") is None


@pytest.mark.parametrize("value", ["", "  ", [], ()])
def test_on_empty_is_refused(value):
    with pytest.raises(SpawnUsageError) as err:
        on_within(parse_on(value), 4, "w")
    assert str(err.value) == f"--on needs the ranks that run the cell, like 0 or 0,2-3, not {value!r}"


@pytest.mark.parametrize("value", ["a", "0,,1", "-1", "1-", "x-2", "1.5", ["a"]])
def test_on_garbled_is_refused_in_the_words_of_ranks(value):
    with pytest.raises(SpawnUsageError, match=r"^--on expects a list"):
        on_within(parse_on(value), 4, "w")


@pytest.mark.parametrize(("value", "first_bad"), [("4", 4), ("0,7,5", 5), ([9], 9), ([-2], -2)])
def test_on_names_the_world_and_its_ranks_when_out_of_range(value, first_bad):
    with pytest.raises(SpawnUsageError) as err:
        on_within(parse_on(value), 4, "model")
    assert str(err.value) == f"--on: rank {first_bad} does not exist in world 'model' of 4 ranks (0-3)"


# -- --env ----------------------------------------------------------------------------------------


def test_env_pairs_split_at_the_first_equals_sign():
    assert parse_env(["A=1", "B=x=y", "C=", "_D=two words"]) == {"A": "1", "B": "x=y", "C": "", "_D": "two words"}


def test_env_from_the_api_is_a_dict_and_values_become_strings():
    env = parse_env({"K": 1, "L": "v"})
    assert env == {"K": "1", "L": "v"}
    assert all(isinstance(v, str) for v in env.values())


@pytest.mark.parametrize("value", [None, [], {}])
def test_env_unset_is_empty(value):
    assert parse_env(value) == {}


@pytest.mark.parametrize("item", ["NOEQ", "=1", "="])
def test_env_item_without_a_key_and_value(item):
    with pytest.raises(SpawnUsageError) as err:
        parse_env(["OK=1", item])
    assert str(err.value) == f"--env expects KEY=VALUE, got {item!r}"


@pytest.mark.parametrize("env", [["A-B=1"], ["A B=1"], ["A.B=1"], {"bad key": "x"}, {"é-x": "1"}])
def test_env_bad_variable_names(env):
    key = next(iter(env)) if isinstance(env, dict) else env[0].partition("=")[0]
    with pytest.raises(SpawnUsageError) as err:
        parse_env(env)
    assert str(err.value) == f"--env: {key!r} is not a valid environment variable name"


# -- --timeout, --grace-period --------------------------------------------------------------------


@pytest.mark.parametrize(("value", "expected"), [(1, 1.0), ("2.5", 2.5), (0.001, 0.001), ("1e3", 1000.0)])
def test_seconds_accepted(value, expected):
    for allow_zero in (True, False):
        seconds = parse_seconds(value, "--timeout", allow_zero=allow_zero)
        assert seconds == expected and isinstance(seconds, float)


def test_seconds_unset_is_none():
    assert parse_seconds(None, "--timeout", allow_zero=False) is None


@pytest.mark.parametrize("value", [0, "0", 0.0, "-0"])
def test_zero_seconds_only_where_allowed(value):
    assert parse_seconds(value, "--grace-period", allow_zero=True) == 0.0
    with pytest.raises(SpawnUsageError) as err:
        parse_seconds(value, "--timeout", allow_zero=False)
    assert str(err.value) == f"--timeout must be more than zero seconds, not {value!r}"


@pytest.mark.parametrize("value", [-1, "-0.5", "nan", float("nan")])
def test_negative_or_nan_seconds(value):
    with pytest.raises(SpawnUsageError) as err:
        parse_seconds(value, "--grace-period", allow_zero=True)
    assert str(err.value) == f"--grace-period must be zero or more seconds, not {value!r}"
    with pytest.raises(SpawnUsageError) as err:
        parse_seconds(value, "--timeout", allow_zero=False)
    assert str(err.value) == f"--timeout must be more than zero seconds, not {value!r}"


@pytest.mark.parametrize("value", ["x", "", "1s", [1], {}])
def test_seconds_not_a_number(value):
    with pytest.raises(SpawnUsageError) as err:
        parse_seconds(value, "--timeout", allow_zero=False)
    assert str(err.value) == f"--timeout must be a number of seconds, not {value!r}"


def test_infinite_seconds_mean_no_limit():
    assert math.isinf(parse_seconds("inf", "--timeout", allow_zero=False))


# -- SpawnMagics.max_*_kb -------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "expected"), [(0, 0), ("12", 12), (2048, 2048), (" 7 ", 7)])
def test_kb_accepted(value, expected):
    assert parse_kb(value, "SpawnMagics.max_saved_kb") == expected


@pytest.mark.parametrize("value", ["x", None, "1.5", "", [1]])
def test_kb_not_a_whole_number(value):
    with pytest.raises(SpawnUsageError) as err:
        parse_kb(value, "SpawnMagics.max_image_kb")
    assert str(err.value) == f"SpawnMagics.max_image_kb must be a whole number of KB, not {value!r}"


@pytest.mark.parametrize(("value", "expected"), [(0, 0), (10, 10), ("19", 19)])
def test_niceness(value, expected):
    assert parse_niceness(value, "SpawnMagics.rank_niceness") == expected


@pytest.mark.parametrize("value", [-1, 20, "x", None, 1.0, True, "1.5"])
def test_niceness_out_of_linuxs_range_or_not_a_whole_number(value):
    with pytest.raises(SpawnUsageError) as err:
        parse_niceness(value, "SpawnMagics.rank_niceness")
    assert str(err.value) == f"SpawnMagics.rank_niceness must be a whole number from 0 to 19, not {value!r}"


@pytest.mark.parametrize("value", [-1, "-3", True, False])
def test_kb_negative_or_a_bool(value):
    with pytest.raises(SpawnUsageError) as err:
        parse_kb(value, "SpawnMagics.max_saved_kb")
    assert str(err.value) == f"SpawnMagics.max_saved_kb must be zero or more KB, not {value!r}"


# -- -n / --nprocs --------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "expected"), [(4, 4), ("4", 4), (" 16 ", 16), (1, 1)])
def test_nprocs_numbers(value, expected):
    n = parse_nprocs(value)
    assert n == expected and type(n) is int


@pytest.mark.parametrize("value", ["auto", " AUTO ", "Auto"])
def test_nprocs_auto(value):
    assert parse_nprocs(value) == "auto"


@pytest.mark.parametrize("value", [0, -2, "0", "x", "", True, False, 2.7, "2.0", None, "auto4"])
def test_nprocs_refused(value):
    with pytest.raises(SpawnUsageError) as err:
        parse_nprocs(value)
    assert str(err.value) == f"--nprocs must be a positive integer or 'auto', not {value!r}"


@pytest.mark.parametrize(
    ("gpus", "cpus", "expected"),
    [(0, 0, 1), (0, 1, 1), (0, 3, 3), (0, 4, 4), (0, 64, 4), (1, 64, 1), (2, 1, 2), (8, 16, 8)],
)
def test_auto_nprocs_is_one_rank_per_gpu_else_up_to_four_cpu_ranks(gpus, cpus, expected):
    assert auto_nprocs(gpus, cpus) == expected


# -- --start-method, --backend --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("auto", "auto"),
        ("fork", "fork"),
        (" Fork ", "fork"),
        ("SPAWN", "spawn"),
        ("forkserver", "forkserver"),
    ],
)
def test_start_method_names(value, expected):
    assert parse_start_method(value) == expected


@pytest.mark.parametrize("value", ["thread", "fork server", "posix_spawn", "", None])  # None: the door gives "auto"
def test_start_method_unknown(value):
    with pytest.raises(SpawnUsageError) as err:
        parse_start_method(value)
    assert str(err.value) == f"--start-method must be one of fork, spawn, forkserver, not {value!r}"


@pytest.mark.parametrize(
    ("value", "expected"),
    [(" none ", "none"), ("GLOO", "gloo"), ("nccl", "nccl"), ("Auto", "auto")],
)
def test_backend_names(value, expected):
    assert parse_backend(value) == expected


@pytest.mark.parametrize("value", ["mpi", "ucc", "gloo,nccl", "", None])
def test_backend_unknown(value):
    with pytest.raises(SpawnUsageError) as err:
        parse_backend(value)
    assert str(err.value) == f"--backend must be one of none, gloo, nccl, auto, not {value!r}"


# -- --xray ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [(" ON ", "on"), ("off", "off"), ("Values", "values"), (True, "on"), (False, "off")],
)
def test_xray_modes_and_launchs_booleans(value, expected):
    assert parse_xray(value) == expected


@pytest.mark.parametrize("value", ["yes", "", "value", 1, None])
def test_xray_unknown(value):
    with pytest.raises(SpawnUsageError) as err:
        parse_xray(value)
    assert str(err.value) == f"--xray must be on, off or values, not {value!r}"


def test_a_bad_value_reaches_ipython_as_its_own_usage_error():
    """IPython prints exactly its ``UsageError`` as one line, no traceback (``etype is UsageError``: not a
    subclass of it), what every message above relies on: the magic raises each as one.  (A real shell,
    in a process of its own: one made here would be every later test's ``get_ipython()``.)"""
    code = (
        "from IPython.core.error import UsageError\n"
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "shell = InteractiveShell.instance()\n"
        "shell.run_line_magic('load_ext', 'nbspawn')\n"
        "error = shell.run_cell('%%spawn --backend mpi\\npass').error_in_exec\n"
        "print(type(error) is UsageError, error)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.stdout.splitlines()[-1:] == ["True --backend must be one of none, gloo, nccl, auto, not 'mpi'"], done.stderr
