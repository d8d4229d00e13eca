#!/usr/bin/env bash
# Fuzzing pass over every parser: builds each libFuzzer target (tests/fuzz/fuzz_<target>.c) into build-fuzz/ and runs
# it for FUZZ_SECONDS (default 15; `make fuzz` passes 60) over its seed corpus tests/fuzz/corpus/<target>, FUZZ_JOBS
# (default 2) targets at a time. libFuzzer writes new inputs into the first corpus directory it is given, so that is a
# temporary directory and the committed corpus is only read. A crash input is kept as build-fuzz/artifacts/<target>-*.
# One check per target (it built and ran without a finding); the last line is "fuzz: N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/../.."
SECS=${FUZZ_SECONDS:-15}
JOBS=${FUZZ_JOBS:-2}
RSS_MB=${FUZZ_RSS_MB:-2048}
targets=()
for f in tests/fuzz/fuzz_*.c; do
    t=$(basename "$f" .c)
    targets+=("${t#fuzz_}")
done
work=$(mktemp -d /tmp/zaya-fuzz.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p build-fuzz/artifacts
start=$(date +%s)

# build: in parallel, then once more per target for its status (a no-op for those that built)
make --no-print-directory -k -j"$JOBS" fuzz-build >"$work/build.log" 2>&1

run_one() { # target: runs it, leaves the exit status in $work/<target>.rc
    local t=$1
    mkdir -p "$work/new-$t"
    env ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
        "build-fuzz/fuzz_$t" -max_total_time="$SECS" -timeout=10 -rss_limit_mb="$RSS_MB" -print_final_stats=1 \
        -artifact_prefix="build-fuzz/artifacts/$t-" "$work/new-$t" "tests/fuzz/corpus/$t" >"$work/$t.log" 2>&1
    echo $? >"$work/$t.rc"
}

built=()
for t in "${targets[@]}"; do
    if make --no-print-directory "build-fuzz/fuzz_$t" >>"$work/build.log" 2>&1 && [ -x "build-fuzz/fuzz_$t" ]; then
        built+=("$t")
        while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
        run_one "$t" &
    fi
done
wait

pass=0
fail=0
for t in "${targets[@]}"; do
    if [ ! -e "$work/$t.rc" ]; then
        echo "FAIL fuzz_$t: did not build"
        grep -E "error|fuzz_$t" "$work/build.log" | head -n 20
        fail=$((fail + 1))
        continue
    fi
    rc=$(cat "$work/$t.rc")
    execs=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+).*/\1/p' "$work/$t.log" | tail -n 1)
    seeds=$(find "tests/fuzz/corpus/$t" -type f | wc -l)
    found=$(find "$work/new-$t" -type f | wc -l)
    if [ "$rc" -eq 0 ]; then
        echo "ok   fuzz_$t: ${execs:-?} executions in ${SECS} s (${seeds} seeds, ${found} new inputs, not kept)"
        pass=$((pass + 1))
    else
        echo "FAIL fuzz_$t: exit $rc after ${execs:-?} executions; input in build-fuzz/artifacts/$t-*"
        grep -E "ERROR|runtime error|SUMMARY|fuzz_$t:|Test unit written" "$work/$t.log" | head -n 20
        fail=$((fail + 1))
    fi
done
echo "fuzz: $((fail + pass)) targets, $(($(date +%s) - start)) s"
echo "fuzz: ${pass} passed, ${fail} failed"
[ "$fail" -eq 0 ]
