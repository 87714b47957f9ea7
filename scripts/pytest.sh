#!/usr/bin/env bash
# The README's test command's pytest (`make test`; the hosted runtimes' jobs, .ci/runtime): PYTHON -m pytest ARGS...
#
# Three phases (`--phase`, tests/conftest.py), each after the other, by how much of the machine a test needs:
#   1. `parallel`: the unit, kernel and cluster tests, on NBSPAWN_TEST_WORKERS pytest-xdist workers
#      (default 3), a test module to a worker (--dist loadfile: its kernel and cluster fixtures are started
#      once, its tests run in their order, as in one process). They mostly wait on ranks, kernels and
#      timeouts, so more workers than cores can pay (measured: docs/development.md, "Test time");
#   2. `browser`: the browser tests, on NBSPAWN_BROWSER_WORKERS workers (default 3; 1 runs them in one process,
#      0 skips the phase), a module to a worker:
#      each drives its own Chromium, server, kernel and ranks, and waits on them part of the time (two
#      workers left 25 % of the two cores idle, three 8 %: the phase took 430 s instead of 481, 2026-12-02);
#   3. `alone`: the tests marked `alone` (they time a page under a flood or a Stop, or compare what the
#      whole machine holds), one at a time in this process, with nothing beside them.
#
# NBSPAWN_TEST_WORKERS=0 runs everything in one process, in one go. Exits as pytest does: 5 (nothing
# collected) only when no phase collected anything; otherwise the first failure's status, or 0.
#
# NBSPAWN_JUNIT_DIR (set by .ci/run): each phase also writes its JUnit report there, named after the job
# (NBSPAWN_CI_JOB, default dev) and the phase, for the summary that closes CI's log (scripts/ci_summary.py).
set -uo pipefail
python="${1:?usage: scripts/pytest.sh PYTHON [PYTEST-ARGS...]}"
shift
workers="${NBSPAWN_TEST_WORKERS:-3}"
browser_workers="${NBSPAWN_BROWSER_WORKERS:-3}"
report() {  # the JUnit report's option for one phase, where CI asked for them
    [[ -z "${NBSPAWN_JUNIT_DIR:-}" ]] || echo "--junitxml=$NBSPAWN_JUNIT_DIR/${NBSPAWN_CI_JOB:-dev}-$1.xml"
}
if [[ "$workers" == 0 ]]; then
    exec "$python" -m pytest $(report all) "$@"
fi
# --no-loadscope-reorder: modules go out in collection order, the longest first (tests/conftest.py)
"$python" -m pytest -n "$workers" --dist loadfile --no-loadscope-reorder --phase parallel $(report parallel) "$@"
parallel=$?
browser=5
if [[ "$browser_workers" != 0 ]]; then  # 0: a job that runs no browser test (-m "not browser") skips the phase
    echo "pytest.sh: now the browser tests, $browser_workers at a time" >&2
    # One at a time runs in this process: an xdist worker would collect the whole selection once more
    # (the Colab job's one browser module: its classic Notebook's scenes)
    xdist=(-n "$browser_workers" --dist loadfile)
    [[ "$browser_workers" != 1 ]] || xdist=()
    "$python" -m pytest "${xdist[@]}" --phase browser $(report browser) "$@"
    browser=$?
fi
echo "pytest.sh: now the tests that run alone" >&2
"$python" -m pytest --phase alone $(report alone) "$@"
alone=$?
collected=0
for rc in "$parallel" "$browser" "$alone"; do
    if [[ $rc -ne 0 && $rc -ne 5 ]]; then exit "$rc"; fi
    [[ $rc -eq 5 ]] || collected=1
done
[[ $collected -eq 1 ]] || exit 5
exit 0
