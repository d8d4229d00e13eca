#!/usr/bin/env bash
# The chaos suite at small scale (2 disturbed runs, 5 disturbances each) for `make test`; `make chaos` runs the full
# count. Prints "chaos: N passed, N failed".
cd "$(dirname "$0")/../.."
exec tests/chaos/chaos.sh --runs "${CHAOS_RUNS:-2}" --disturbances 5 --seed "${CHAOS_SEED:-1}"
