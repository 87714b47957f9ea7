#!/usr/bin/env bash
# `make runtimes`: the runtime jobs one after another, each whatever the others did (as `make -k` ran
# them), and the next job's venv built (`.ci/runtime --prepare`) while this job's tests run. A venv's
# build is mostly downloading and unpacking torch's wheels (34-51 s a job, 213 s of the five on
# 2026-12-02), which the tests beside it hardly notice: it runs at the lowest CPU and disk priority. Two
# venvs are on the disk at once at most (5-7 GB each). Usage: scripts/runtimes.sh runtime-NAME ...
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
venvs="${NBSPAWN_RUNTIME_VENVS:-$PWD/.venvs}"
low=(nice -n 19)
! command -v ionice >/dev/null || low+=(ionice -c 2 -n 7)
jobs=("$@")
failed=0
for i in "${!jobs[@]}"; do
    job="${jobs[$i]}"
    next="${jobs[$((i + 1))]:-}"
    make --no-print-directory "$job" &
    pid=$!
    if [[ -n "$next" ]]; then
        # once this job's tests have begun (its venv is built) or the job is over
        while kill -0 "$pid" 2>/dev/null && [[ ! -e "$venvs/${job#runtime-}.testing" ]]; do sleep 1; done
        "${low[@]}" make --no-print-directory "$next" PREPARE=--prepare >/dev/null 2>&1 &
    fi
    wait "$pid" || failed=1
done
exit "$failed"
