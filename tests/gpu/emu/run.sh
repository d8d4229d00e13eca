#!/usr/bin/env bash
# GPU kernel sources run on the CPU (cuda_emu.h): the grouped expert GEMM (test_expert_gemm.cpp), the tensor-core flash
# attention (test_attention_tc.cpp) and the fp32 one with its sliding windows (test_attention_fp32.cpp), forward and
# backward, and cached decoding's attention over a bf16 KV cache against the fp32 one, its keys in pieces and not,
# blocks at once sharing a (row, head)'s pieces (test_decode_attention.cpp),
# each against a double-precision reference, the cross-entropy with its bf16 gradient (test_xent.cpp), and the
# optimizer's AdamW pass with its bf16 weight copy (test_adamw.cpp) against the CPU's own adamw_elem bit for bit, and
# decoding's few-row products with the experts' SwiGLU and combine (test_skinny.cpp), and the CCA convolution's
# products on tensor cores (test_cca_tc.cpp), and the mirror that completes Newton–Schulz's banded symmetric products
# (test_mirror.cpp), and decoding's row moves, two copies a launch and a ragged batch's CCA values (test_decode_rows.cpp),
# and the router's tail in one launch against the five it replaces (test_router_tail.cpp), and a decoding step's
# layers as one persistent kernel, every block at once with a grid barrier between phases and layers, against eleven
# launches a layer (test_decode_layer.cpp: a phase that reads another block's writes without the barrier is a reported race; its
# first cases also under AddressSanitizer, which sees its L2 prefetches' ranges),
# with 32-lane warps (CUDA) and 64-lane wavefronts (HIP on AMD). Under ThreadSanitizer a missing barrier between threads or lanes is a reported race; a wrong tile, bound,
# mask or layout assumption a wrong number. The attention tests run their first cases (--quick) under the sanitizer
# with 32 lanes and all of them without it with 64 (the sanitizer makes them minutes). Part of `make test` (no GPU needed); the same kernels run on a GPU in
# make test-gpu. Ends with "gpu-emu: N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
CXX=${CXX:-g++}
jobs=${EMU_JOBS:-$(nproc)}
pass=0
fail=0
runs=() # "test warp sanitize [args]", in order
add() { runs+=("$*"); }
add test_expert_gemm 32 tsan
add test_expert_gemm 64 -
add test_attention_tc 32 tsan --quick
add test_attention_tc 64 -
add test_attention_fp32 32 tsan --quick
add test_attention_fp32 64 -
add test_adamw 32 tsan
add test_xent 32 tsan
add test_xent 64 -
add test_decode_attention 32 tsan --quick
add test_decode_attention 64 -
add test_skinny 32 tsan
add test_skinny 64 -
add test_cca_tc 32 tsan --quick
add test_cca_tc 64 -
add test_mirror 32 tsan
add test_mirror 64 -
add test_decode_rows 32 tsan
add test_decode_rows 64 -
add test_router_tail 32 tsan --quick
add test_router_tail 64 -
add test_decode_layer 32 tsan --quick
add test_decode_layer 32 asan --quick
add test_decode_layer 64 -

# Every binary first, a compile a core (each is one single-threaded g++), then the runs in order: the compiles are
# about half of this suite's time.
build() { # test warp sanitize
    local t=$1 warp=$2 san=$3 flags="-O2"
    [ "$san" = tsan ] && flags="-O1 -fsanitize=thread"
    [ "$san" = asan ] && flags="-O1 -fsanitize=address,undefined -fno-sanitize-recover=undefined"
    # shellcheck disable=SC2086
    "$CXX" -std=c++20 -g $flags -Wall -Wextra -Wno-unknown-pragmas -Werror -DGPU_WARP="$warp" -I. \
        -I../../../src/gpu -I../../../src "$t.cpp" -o "$out/$t.$warp.$san" -lpthread >"$out/$t.$warp.$san.log" 2>&1
}
export -f build
export CXX out
printf '%s\n' "${runs[@]}" | cut -d' ' -f1-3 | xargs -P "$jobs" -L 1 bash -c 'build "$@"' _ || true

for r in "${runs[@]}"; do
    read -r t warp san args <<<"$r"
    echo "--- $t, warp of $warp lanes$([ "$san" = - ] || echo ", $san")"
    if [ ! -x "$out/$t.$warp.$san" ]; then
        cat "$out/$t.$warp.$san.log"
        fail=$((fail + 1))
        continue
    fi
    # halt_on_error: a race fails the run instead of only printing
    # shellcheck disable=SC2086
    TSAN_OPTIONS="halt_on_error=1 ${TSAN_OPTIONS:-}" "$out/$t.$warp.$san" $args | tee "$out/run"
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
