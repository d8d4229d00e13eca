#!/usr/bin/env bash
# Runs every test suite and prints one closing line with the totals: "N passed, N failed".
# Each suite prints its own "<suite>: N passed, N failed" line; a suite that crashes before printing it
# counts as one failure.
set -uo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
total_pass=0
total_fail=0
log_dir=build/test-logs
mkdir -p "$log_dir"
suite_times=() # "seconds name" per suite: CI has 90 minutes, and the table at the end says where they go

run_suite() {
    local name=$1
    shift
    echo "=== suite: $name"
    local log="$log_dir/$name.log"
    local start=$SECONDS
    "$@" 2>&1 | tee "$log"
    local rc=${PIPESTATUS[0]}
    suite_times+=("$((SECONDS - start)) $name")
    local line
    line=$(grep -E '^[a-z_-]+: [0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
    if [ -z "$line" ]; then
        echo "suite $name: no summary line (exit $rc)"
        total_fail=$((total_fail + 1))
        return
    fi
    local p f
    p=$(echo "$line" | sed -E 's/.*: ([0-9]+) passed, ([0-9]+) failed.*/\1/')
    f=$(echo "$line" | sed -E 's/.*: ([0-9]+) passed, ([0-9]+) failed.*/\2/')
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
    total_pass=$((total_pass + p))
    total_fail=$((total_fail + f))
}

# CI (.ci/run sets ZAYA_STRICT=1): the -Werror builds with gcc and clang at several -march targets.
if [ "${ZAYA_STRICT:-0}" = 1 ]; then
    run_suite strict bash tests/strict.sh
    run_suite hip bash tests/hip_check.sh
fi
run_suite layers bash tests/layers.sh # includes only point down (docs/architecture.md)
run_suite unit build/zaya_tests
# The unit tests again under one OpenBLAS core per instruction class this CPU runs (zaya info's "blas cores"): the
# tests that compare two paths (decode vs the full forward, each level vs generic, fast paths vs simple ones) must
# hold whatever core the library would have picked, not only the one zaya sets.
for core in $(build/zaya info | sed -n 's/^blas cores *\([A-Za-z ]*\) (.*/\1/p'); do
    run_suite "unit-blas-$core" env OPENBLAS_CORETYPE="$core" build/zaya_tests
done
run_suite unit-asan env ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 build-asan/zaya_tests
run_suite fuzz bash tests/fuzz/run.sh
run_suite gpu-emu bash tests/gpu/emu/run.sh # the tensor-core kernels' source on the CPU: no GPU needed
run_suite pdl python3 tests/gpu/pdl_check.py # kernels launched to overlap the one before wait for it first
# make test-gpu's kernel and model suites with the whole GPU backend built on the CPU emulator (GPU_EMU=1, build-emu)
run_suite gpu-emu-backend bash tests/gpu/emu/backend.sh
# zaya itself on the emulated GPU: train, resume, generate and serve with --device cuda (make test-gpu's, smaller)
run_suite gpu-emu-train bash tests/gpu/emu/train.sh
for t in tests/cli/test_*.sh; do # not tests/cli/fixture.sh: shared set-up the suites source
    [ -e "$t" ] || continue
    run_suite "$(basename "$t" .sh)" bash "$t"
done
for t in tests/oracle/test_*.py; do
    [ -e "$t" ] || continue
    run_suite "$(basename "$t" .py)" python3 "$t"
done

# GPU suites (make test-gpu) need an NVIDIA GPU: here the CUDA sources were compiled (make all) and the GPU test
# binary linked, but nothing runs on a GPU.
if [ -x build/zaya_gpu_tests ]; then
    echo "GPU tests on a GPU skipped: no GPU in this run (CUDA sources compiled into build/zaya and build/zaya_gpu_tests; the same suites ran on the emulator above; run make test-gpu on a GPU machine)"
else
    echo "GPU tests skipped: built without GPU support (no nvcc, or CUDA=0)"
fi

echo
echo "=== seconds a suite (${SECONDS} s in all)"
printf '%s\n' "${suite_times[@]}" | sort -rn | awk '{ printf "%6d  %s\n", $1, $2 }'
echo "${total_pass} passed, ${total_fail} failed"
[ "$total_fail" -eq 0 ]
