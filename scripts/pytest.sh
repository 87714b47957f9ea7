#!/usr/bin/env bash
# The README's test command's pytest (`make test`; the hosted runtimes' jobs, .ci/runtime): PYTHON -m pytest ARGS...
#
#   1. every test but those that must run alone, on NBSPAWN_TEST_WORKERS pytest-xdist workers (default 3),
#      a test module to a worker (--dist loadfile: its kernel and cluster fixtures are started once, its
#      tests run in their order, as in one process). The kernel tests mostly wait on ranks, kernels and
#      timeouts, so more workers than cores can pay (measured: docs/development.md, "Test time");
#   2. then those (`--alone only`: the browser tests, and the tests marked `alone`, which time themselves
#      or compare what the whole machine holds), one at a time in this process, with nothing beside them.
#
# NBSPAWN_TEST_WORKERS=0 runs everything in one process, in one go. Exits as pytest does: 5 (nothing
# collected) only when neither step collected anything; otherwise the first failure's status, or 0.
set -uo pipefail
python="${1:?usage: scripts/pytest.sh PYTHON [PYTEST-ARGS...]}"
shift
workers="${NBSPAWN_TEST_WORKERS:-3}"
if [[ "$workers" == 0 ]]; then
    exec "$python" -m pytest "$@"
fi
"$python" -m pytest -n "$workers" --dist loadfile --alone skip "$@"
parallel=$?
echo "pytest.sh: now the tests that run alone" >&2
"$python" -m pytest --alone only "$@"
alone=$?
for rc in "$parallel" "$alone"; do
    if [[ $rc -ne 0 && $rc -ne 5 ]]; then exit "$rc"; fi
done
if [[ $parallel -eq 5 && $alone -eq 5 ]]; then exit 5; fi
exit 0
