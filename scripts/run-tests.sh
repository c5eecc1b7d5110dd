#!/usr/bin/env bash
# run-tests.sh: the test suite as `make test` runs it, in two phases with one verdict.
#
#   1. every test not marked `serial`, spread over TEST_WORKERS pytest-xdist workers
#      (`--dist loadgroup`: the tests of one `xdist_group` run on one worker, one after
#      another: those sharing a session server, or CPU-heavy jobs that must not overlap);
#   2. the `serial` tests alone on the machine (tests/conftest.py marks them: the container
#      tests and their engine, the end-to-end pipelines, SIGTERM drains, load and slow
#      clients), where a second worker's load would change what they measure or wait for.
#
# Each phase ends with its 15 slowest tests (--durations), to keep the suite's time in view.
# Usage: run-tests.sh [PYTEST_ARGS...]   (passed to both phases; a `-m` there replaces the
#        phase's own marker expression, so select by path or -k instead)
# Environment: PYTHON (default .venv/bin/python), TEST_WORKERS (default 2).
# Exit: 0 when both phases passed (a phase that collected nothing, pytest's 5, counts as
# passed unless both collected nothing: then 1, "no tests"); otherwise the first failing
# phase's pytest exit code.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
WORKERS=${TEST_WORKERS:-2}

t0=$SECONDS
"$PY" -m pytest -n "$WORKERS" --dist loadgroup -m "not serial" --durations=15 "$@"
rc1=$?
t1=$SECONDS
"$PY" -m pytest -p no:xdist -m serial --durations=15 "$@"
rc2=$?
echo "run-tests.sh: parallel phase $((t1 - t0)) s (exit $rc1), serial phase $((SECONDS - t1)) s (exit $rc2)" >&2
if [[ $rc1 -eq 5 && $rc2 -eq 5 ]]; then
    echo "run-tests.sh: pytest collected no tests: failing" >&2
    exit 1
fi
for rc in $rc1 $rc2; do
    if [[ $rc -ne 0 && $rc -ne 5 ]]; then
        exit "$rc"
    fi
done
exit 0
