#!/usr/bin/env bash
# The tensor-core sources run on the CPU (cuda_emu.h), under ThreadSanitizer: a missing barrier between threads or
# lanes is a reported race, a wrong tile or bound a wrong number. Part of `make test` (no GPU needed); the same
# kernels run on a GPU in make test-gpu. Ends with "gpu-emu: N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
CXX=${CXX:-g++}
pass=0
fail=0
# 32-lane warps (CUDA) and 64-lane wavefronts (HIP on AMD: 8 warps are then 512 threads)
for warp in 32 64; do
    echo "--- warp of $warp lanes"
    if ! "$CXX" -std=c++20 -O1 -g -fsanitize=thread -Wall -Wextra -Wno-unknown-pragmas -Werror -DGPU_WARP=$warp \
        -I. -I../../../src/gpu test_expert_gemm.cpp -o "$out/test_$warp" -lpthread 2>"$out/log"; then
        cat "$out/log"
        fail=$((fail + 1))
        continue
    fi
    # halt_on_error: a race fails the run instead of only printing
    TSAN_OPTIONS="halt_on_error=1 ${TSAN_OPTIONS:-}" "$out/test_$warp" | tee "$out/run"
    line=$(grep -E '^gpu-emu: [0-9]+ passed' "$out/run" | tail -n 1)
    if [ -z "$line" ]; then
        fail=$((fail + 1))
        continue
    fi
    pass=$((pass + $(echo "$line" | sed -E 's/.*: ([0-9]+) passed.*/\1/')))
    fail=$((fail + $(echo "$line" | sed -E 's/.*, ([0-9]+) failed.*/\1/')))
done
echo "gpu-emu: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
