#!/usr/bin/env bash
# The whole GPU backend on the CPU: make GPU_EMU=1 compiles src/gpu (kernels, gpu_ctx.cu's cuBLASLt products, the
# model, optimizer, decoding and data-parallel host code) against tests/gpu/emu's CUDA runtime and cuBLASLt, and
# make test-gpu's kernel and model suites (build/zaya_gpu_tests) run on it: every kernel against its CPU namesake,
# the model against the CPU path, the optimizer, cached decoding, with the code that launches them, as on a GPU. Cases
# sized for a GPU (a benchmark's shapes, throughput probes) are named and left to make test-gpu. What the emulator
# cannot show: timing, Hopper's wgmma + TMA experts, cuDNN, NCCL. Ends with "gpu-emu-backend: N passed, N failed".
#   tests/gpu/emu/backend.sh [group ...]   (groups as build/zaya_gpu_tests takes them; default all, two at a time)
set -uo pipefail
cd "$(dirname "$0")/../../.." || exit 1
BUILD=${EMU_BUILD:-build-emu}
jobs=${EMU_JOBS:-$(nproc 2>/dev/null || echo 2)}
if ! make --no-print-directory -s -j"$jobs" GPU_EMU=1 BUILD="$BUILD" ${ZAYA_STRICT:+WERROR=1} "$BUILD/zaya_gpu_tests"; then
    echo "gpu-emu-backend: 0 passed, 1 failed (the emulated build failed)"
    exit 1
fi
groups=("$@")
[ ${#groups[@]} -gt 0 ] || groups=(decode pool model cca optim moe gemm attention norms) # the slowest first
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# a group a process (each runs on one thread), its output kept for printing in order
printf '%s\n' "${groups[@]}" | xargs -P "$jobs" -I{} sh -c "s=\$(date +%s); '$BUILD/zaya_gpu_tests' {} >'$out/{}.log' 2>&1; \
    echo \$? >'$out/{}.rc'; echo \$((\$(date +%s) - s)) >'$out/{}.s'"
pass=0
fail=0
for g in "${groups[@]}"; do
    cat "$out/$g.log"
    echo "  (group $g: $(cat "$out/$g.s") s)"
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$out/$g.log" | tail -n 1)
    if [ -z "$line" ]; then
        echo "FAIL group $g: no summary line (exit $(cat "$out/$g.rc" 2>/dev/null))"
        fail=$((fail + 1))
        continue
    fi
    p=${line%% passed*}
    f=${line#*, }
    f=${f%% failed*}
    [ "$(cat "$out/$g.rc")" != 0 ] && [ "$f" = 0 ] && f=1
    pass=$((pass + p))
    fail=$((fail + f))
done
echo "gpu-emu-backend: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
