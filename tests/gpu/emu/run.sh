#!/usr/bin/env bash
# GPU kernel sources run on the CPU (cuda_emu.h: a fiber per CUDA thread), each against a reference: the emulator's own
# checks (test_emu.cpp: the sums a block, a warp and a cooperative grid make, and that a missing barrier is a reported
# race and a skipped grid barrier a reported deadlock), a decoding step's layers as one persistent kernel against the
# eleven launches a layer it replaces (test_decode_layer.cpp: a phase that reads another block's writes without the
# grid barrier is a reported race; under AddressSanitizer it sees its L2 prefetches' ranges), the tensor-core flash
# attention (test_attention_tc.cpp) and the fp32 one with its sliding windows (test_attention_fp32.cpp), forward and
# backward, the grouped expert GEMM (test_expert_gemm.cpp), cached decoding's attention over a bf16 KV cache against
# the fp32 one, its keys in pieces and not, blocks at once sharing a (row, head)'s pieces (test_decode_attention.cpp),
# the CCA convolution's products on tensor cores (test_cca_tc.cpp) and every other CCA kernel, forward and backward
# (test_cca.cpp), the experts' grouping of rows (a stable counting
# sort by warp ballots) and the routing statistics (test_moe_routing.cpp; at 64 lanes the HIP build's form), their
# rows' gather, scatter-add, combine, gate backward and SwiGLU with device-held counts (test_moe_rows.cpp), RMSNorm
# forward and backward with the column sums every norm's parameter gradient uses (test_norms.cpp), the
# router's tail in one launch against the five it replaces (test_router_tail.cpp), decoding's few-row products with the experts' SwiGLU and combine (test_skinny.cpp),
# the optimizer's AdamW pass with its bf16 weight copy against the CPU's own adamw_elem bit for bit (test_adamw.cpp),
# the cross-entropy with its bf16 gradient (test_xent.cpp), the mirror that completes Newton–Schulz's banded symmetric
# products (test_mirror.cpp), the optimizer's conversions, sums, clipping and whole Muon steps (test_optim.cpp), and decoding's row moves, two copies a launch and a ragged batch's CCA values
# (test_decode_rows.cpp).
# Each runs with 32-lane warps (CUDA) under ThreadSanitizer, where a missing barrier between threads or lanes is a
# reported race (the slowest ones their first cases, --quick: the sanitizer's clocks grow with the threads), and
# without it with all its cases, at 32 lanes and with 64-lane wavefronts (HIP on AMD); a wrong tile, bound, mask or
# layout assumption is a wrong number. Part of `make test` (no GPU needed); the same kernels run on a GPU in
# make test-gpu. Ends with "gpu-emu: N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")" || exit 1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
CXX=${CXX:-g++}
jobs=${EMU_JOBS:-$(nproc)}
pass=0
fail=0
runs=() # "test warp sanitize [args]", in order
add() { runs+=("$*"); }
# The slowest (under the sanitizer) near the top: the runs start in this order, a core each.
add test_emu 32 tsan
add test_emu 64 -
add test_decode_layer 32 tsan --quick
add test_decode_layer 32 asan
add test_decode_layer 32 -
add test_decode_layer 64 -
add test_attention_tc 32 tsan --quick
add test_attention_tc 32 -
add test_attention_tc 64 -
add test_optim 32 tsan
add test_optim 64 -
add test_expert_gemm 32 tsan
add test_expert_gemm 64 -
add test_attention_fp32 32 tsan
add test_attention_fp32 64 -
add test_decode_attention 32 tsan --quick
add test_decode_attention 32 -
add test_decode_attention 64 -
add test_cca_tc 32 tsan
add test_cca_tc 64 -
add test_cca 32 tsan
add test_cca 64 -
add test_skinny 32 tsan
add test_skinny 64 -
add test_norms 32 tsan
add test_norms 64 -
add test_moe_routing 32 tsan --quick
add test_moe_rows 32 tsan
add test_moe_rows 64 -
add test_moe_routing 32 -
add test_moe_routing 64 -
add test_router_tail 32 tsan --quick
add test_router_tail 32 -
add test_router_tail 64 -
add test_decode_rows 32 tsan
add test_decode_rows 64 -
add test_xent 32 tsan
add test_xent 64 -
add test_mirror 32 tsan
add test_mirror 64 -
add test_adamw 32 tsan

# Every binary first, a compile a core (each is one single-threaded g++).
build() { # test warp sanitize
    local t=$1 warp=$2 san=$3 flags="-O2"
    [ "$san" = tsan ] && flags="-O1 -fsanitize=thread"
    [ "$san" = asan ] && flags="-O1 -fsanitize=address,undefined -fno-sanitize-recover=undefined"
    # shellcheck disable=SC2086
    "$CXX" -std=c++20 -g $flags -Wall -Wextra -Wno-unknown-pragmas -Werror -DGPU_WARP="$warp" -I. \
        -I../../../src/gpu -I../../../src "$t.cpp" emu_runtime.cpp -o "$out/$t.$warp.$san" -lpthread >"$out/$t.$warp.$san.log" 2>&1
}
export -f build
export CXX out
printf '%s\n' "${runs[@]}" | cut -d' ' -f1-3 | xargs -P "$jobs" -L 1 bash -c 'build "$@"' _ || true

# Then the runs, a core each (the emulator runs a test on one OS thread), their outputs in order.
run() { # test warp sanitize [args]
    local t=$1 warp=$2 san=$3 name="$1.$2.$3"
    shift 3
    [ -x "$out/$name" ] || return 0
    # halt_on_error: a race fails the run instead of only printing
    TSAN_OPTIONS="halt_on_error=1 ${TSAN_OPTIONS:-}" "$out/$name" "$@" >"$out/$name.run" 2>&1
    echo $? >"$out/$name.rc"
}
export -f run
printf '%s\n' "${runs[@]}" | xargs -P "$jobs" -L 1 bash -c 'run "$@"' _ || true

for r in "${runs[@]}"; do
    read -r t warp san _ <<<"$r"
    echo "--- $t, warp of $warp lanes$([ "$san" = - ] || echo ", $san")"
    if [ ! -x "$out/$t.$warp.$san" ]; then
        cat "$out/$t.$warp.$san.log"
        fail=$((fail + 1))
        continue
    fi
    cat "$out/$t.$warp.$san.run"
    line=$(grep -E '^gpu-emu: [0-9]+ passed' "$out/$t.$warp.$san.run" | tail -n 1)
    if [ -z "$line" ]; then
        fail=$((fail + 1))
        continue
    fi
    p=$(echo "$line" | sed -E 's/.*: ([0-9]+) passed.*/\1/')
    f=$(echo "$line" | sed -E 's/.*, ([0-9]+) failed.*/\1/')
    # a run that printed its line and then failed (a sanitizer's report at exit) is a failure too
    if [ "$(cat "$out/$t.$warp.$san.rc")" != 0 ] && [ "$f" = 0 ]; then
        echo "FAIL $t exited with status $(cat "$out/$t.$warp.$san.rc")"
        f=1
    fi
    pass=$((pass + p))
    fail=$((fail + f))
done
echo "gpu-emu: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
