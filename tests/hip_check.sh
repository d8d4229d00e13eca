#!/usr/bin/env bash
# HIP portability check (README "GPUs", AMD): every GPU kernel source compiled with hipcc -DZAYA_HIP (gpu_runtime.h
# maps the CUDA names onto HIP, GPU_WARP = 64) and -Werror for AMD CDNA3 (gfx940, the MI300 family's ISA; Debian
# 12's clang 15 does not know gfx942 by name) and CDNA2 (gfx90a, MI200). Nothing is linked or run: Debian 12 packages
# hipcc with HIP 5.2 but not hipBLASLt, rocWMMA or RCCL, so gpu_ctx.cu (cuBLASLt -> hipBLASLt) and
# the tensor-core sources (those including gpu_tc.cuh: WMMA -> rocWMMA) are compiled only where their headers exist,
# and said so otherwise. gpu_expert_gemm_sm90.cu (CUTLASS, wgmma + TMA) is NVIDIA's alone: never for HIP (nor
# gpu_attention_cudnn.cpp, cuDNN's host code, which is not a kernel source).
# Ends with "hip: N passed, N failed" (one per source and target).
set -uo pipefail
cd "$(dirname "$0")/.."
HIPCC=${HIPCC:-hipcc}
archs=${HIP_ARCHS:-gfx940 gfx90a}
if ! command -v "$HIPCC" >/dev/null; then
    echo "hipcc not found (scripts/install-deps.sh installs Debian's hipcc)"
    echo "hip: 0 passed, 1 failed"
    exit 1
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
has_header() { echo "#include <$1>" | "$HIPCC" -x c++ -E - -o /dev/null >/dev/null 2>&1; }
pass=0
fail=0
jobs=() # "src arch": compiled a core at a time (each hipcc is one process), reported in order
for src in src/gpu/*.cu; do
    if grep -q '"cutlass/' "$src"; then
        echo "skip $src: NVIDIA Hopper only (CUTLASS's wgmma + TMA kernels; the HIP build runs the WMMA form instead)"
        continue
    fi
    need=""
    grep -q 'hipblaslt/hipblaslt.h' "$src" && ! has_header hipblaslt/hipblaslt.h && need="hipBLASLt"
    grep -qE 'rocwmma/rocwmma.hpp|"gpu_tc.cuh"' "$src" && ! has_header rocwmma/rocwmma.hpp && need="rocWMMA"
    if [ -n "$need" ]; then
        echo "skip $src: needs $need, which this ROCm does not have (Debian 12 does not package it)"
        continue
    fi
    for arch in $archs; do jobs+=("$src $arch"); done
done
compile() { # src arch: its log, and a .ok file when it compiled
    local o
    o="$out/$(basename "$1").$2"
    "$HIPCC" -std=c++17 -O1 -Wall -Wextra -Wno-unused-parameter -Werror --offload-arch="$2" -DZAYA_HIP \
        -Isrc -Isrc/gpu -c "$1" -o "$o.o" >"$o.log" 2>&1 && touch "$o.ok"
}
export -f compile
export HIPCC out
printf '%s\n' "${jobs[@]}" | xargs -P "${HIP_JOBS:-$(nproc)}" -L 1 bash -c 'compile "$@"' _ || true
for j in "${jobs[@]}"; do
    read -r src arch <<<"$j"
    o="$out/$(basename "$src").$arch"
    if [ -e "$o.ok" ]; then
        echo "ok   $src for $arch"
        pass=$((pass + 1))
    else
        echo "FAIL $src for $arch"
        grep -E 'error|warning' "$o.log" | head -10 | sed 's/^/    /'
        fail=$((fail + 1))
    fi
done
"$HIPCC" --version 2>/dev/null | head -n 1
echo "hip: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
