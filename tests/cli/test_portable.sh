#!/usr/bin/env bash
# The default binary on CPUs older than the one it was built on, emulated by qemu-user: a Haswell (AVX2, no AVX-512)
# and a Nehalem (x86-64-v2: no AVX at all). Each runs zaya info (the kernel level it picks), a forward + backward
# (loss and every gradient against the build machine's own run) and a greedy decode, fp32 and bf16 weights (the same
# tokens as natively). An AVX-512 (or AVX) instruction outside the runtime dispatch dies here with SIGILL on any build
# machine. The quantized-weight kernels each CPU runs, and the many-row quantized paths, are checked against their
# double reference there too. Also:
# ZAYA_CPU asking for a level the CPU lacks is a clear error, and the OpenBLAS core zaya runs (on this
# machine, on a CPU model the library does not know, and as the user or ZAYA_CPU sets it). Ends with "portable: N
# passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/../.."
ZAYA=${ZAYA_BIN:-build/zaya}
. tests/cli/fixture.sh
suite_begin portable
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
# zaya re-executes itself once to set library variables (src/cli/main.c); under qemu-user that exec would run the
# binary natively, outside the emulator. Setting them here keeps every run inside it.
export ZAYA_RUNTIME_CONFIGURED=1 OMP_WAIT_POLICY=passive
unset ZAYA_CPU OPENBLAS_CORETYPE

QEMU=$(command -v qemu-x86_64 || command -v qemu-x86_64-static || true)
if [ "$(uname -m)" != x86_64 ]; then
    bad "x86-64 build machine (this suite emulates older x86-64 CPUs)"
    finish
fi
if [ -z "$QEMU" ]; then
    bad "qemu-x86_64 found (scripts/install-deps.sh installs Debian's qemu-user)"
    finish
fi
work=$(mktemp -d /tmp/zaya-portable.XXXXXX)
trap 'rm -rf "$work"' EXIT

# the tiny config with larger weights, so greedy decoding does not just repeat one token
python3 -c "import json; c = json.load(open('configs/tiny.json')); c['initializer_range'] = 0.5; json.dump(c, open('$work/tiny.json', 'w'))"
$ZAYA init --config "$work/tiny.json" --out "$work/model" --seed 4 >/dev/null 2>&1
check "init the tiny model" test -f "$work/model/model.safetensors"
python3 -c "import numpy as np; np.save('$work/tok.npy', np.random.RandomState(0).randint(0, 128, size=(2, 40)).astype(np.int32))"

# Reference on the build machine, at its best level and at generic.
$ZAYA forward --model "$work/model" --tokens "$work/tok.npy" --grads-out "$work/native.safetensors" \
    >"$work/native.txt" 2>&1
check "native forward + backward" grep -q '^loss ' "$work/native.txt"
prompt="2 17 5 99 31 8"
$ZAYA generate --model "$work/model" --ids --prompt "$prompt" --max-tokens 24 --temperature 0 >"$work/native-gen.txt" 2>/dev/null
# bf16 reference at the generic level: an avx512bf16 machine would round the activations to bf16 as well
ZAYA_CPU=generic $ZAYA generate --model "$work/model" --ids --prompt "$prompt" --max-tokens 24 --temperature 0 \
    --dtype bf16 >"$work/native-gen16.txt" 2>/dev/null
check "native greedy decode: $(cat "$work/native-gen.txt")" test -s "$work/native-gen.txt"

same_grads() { # A.safetensors B.safetensors: every gradient normwise within 1e-5, routing identical
    python3 - "$1" "$2" <<'PY'
import sys, numpy as np
from safetensors.numpy import load_file
a, b = load_file(sys.argv[1]), load_file(sys.argv[2])
assert a.keys() == b.keys(), "different tensors"
worst = 0.0
for k in a:
    if k.startswith("routing."):
        assert (a[k] == b[k]).all(), k + ": routing differs"
        continue
    d = np.linalg.norm(a[k].astype(np.float64) - b[k]) / max(np.linalg.norm(b[k].astype(np.float64)), 1e-30)
    worst = max(worst, d)
print(f"    worst normwise gradient difference {worst:.2g} over {len(a)} tensors")
sys.exit(0 if worst < 1e-5 else 1)
PY
}

loss_of() { sed -n 's/^loss //p' "$1"; }
close_loss() { python3 -c "import sys; a, b = float('$1'), float('$2'); sys.exit(0 if abs(a - b) <= 1e-6 * max(1, abs(b)) else 1)"; }

for cpu in Haswell:avx2 Nehalem:generic; do
    model=${cpu%%:*} level=${cpu##*:}
    run() { "$QEMU" -cpu "$model" "$ZAYA" "$@" 2> >(grep -v "TCG doesn't support requested feature" >&2); }
    run info >"$work/info-$model.txt" 2>&1
    check "$model: zaya info runs" test $? -eq 0
    check "$model: picks the $level kernels" grep -Eq "^kernels +$level " "$work/info-$model.txt"
    check "$model: no AVX-512 found" bash -c "! grep -q '^features.*avx512f' '$work/info-$model.txt'"
    grep -E '^(kernels|bf16 |blas)' "$work/info-$model.txt" | sed 's/^/    /'
    run forward --model "$work/model" --tokens "$work/tok.npy" --grads-out "$work/$model.safetensors" \
        >"$work/$model.txt" 2>&1
    rc=$?
    check "$model: forward + backward (exit $rc)" test $rc -eq 0
    check "$model: loss $(loss_of "$work/$model.txt") = native $(loss_of "$work/native.txt")" \
        close_loss "$(loss_of "$work/$model.txt")" "$(loss_of "$work/native.txt")"
    check "$model: every gradient matches the native run" same_grads "$work/$model.safetensors" "$work/native.safetensors"
    run generate --model "$work/model" --ids --prompt "$prompt" --max-tokens 24 --temperature 0 >"$work/$model-gen.txt" 2>/dev/null
    check "$model: greedy decode = native" cmp -s "$work/$model-gen.txt" "$work/native-gen.txt"
    run generate --model "$work/model" --ids --prompt "$prompt" --max-tokens 24 --temperature 0 --dtype bf16 \
        >"$work/$model-gen16.txt" 2>/dev/null
    rc=$?
    check "$model: greedy decode with bf16 weights (exit $rc)" test $rc -eq 0 -a -s "$work/$model-gen16.txt"
    check "$model: bf16 greedy decode = native" cmp -s "$work/$model-gen16.txt" "$work/native-gen16.txt"
    # the quantized-weight kernels this CPU runs (src/kernels/quant_isa.c), each against its double reference
    check "$model: picks the $level quantized-weight kernels" grep -Eq "^quant +$level kernels" "$work/info-$model.txt"
    "$QEMU" -cpu "$model" "${ZAYA_TESTS_BIN:-build/zaya_tests}" quant_kernels >"$work/$model-quant.txt" 2>&1
    check "$model: $(sed -n 's/^ *\([0-9]* kernels of [0-9]* run here\).*/\1/p' "$work/$model-quant.txt"), each = its double reference" \
        grep -Eq "unit: [1-9][0-9]* passed, 0 failed" "$work/$model-quant.txt"
    # the many-row paths (src/kernels/quant_many.c: fp32 panels, bf16 emulated, oneDNN's int8), the same way
    "$QEMU" -cpu "$model" "${ZAYA_TESTS_BIN:-build/zaya_tests}" quant_many_paths >"$work/$model-many.txt" 2>&1
    check "$model: the quantized many-row paths, each = its double reference" \
        grep -q "unit: 1 passed, 0 failed" "$work/$model-many.txt"
done

# The demo model's shape (configs/demo-model.json, 2.0 M parameters) decoding under the Haswell: the same greedy
# tokens as natively (its forward + backward under emulation takes ~35 s, so that stays on the tiny model above)
python3 -c "import json; c = json.load(open('configs/demo-model.json')); c['initializer_range'] = 0.5; json.dump(c, open('$work/demo.json', 'w'))"
$ZAYA init --config "$work/demo.json" --out "$work/demo" --seed 4 >/dev/null 2>&1
$ZAYA generate --model "$work/demo" --ids --prompt "$prompt" --max-tokens 32 --temperature 0 >"$work/demo-native.txt" 2>/dev/null
"$QEMU" -cpu Haswell "$ZAYA" generate --model "$work/demo" --ids --prompt "$prompt" --max-tokens 32 --temperature 0 \
    >"$work/demo-haswell.txt" 2>/dev/null
check "Haswell: the demo model's greedy decode = native" \
    bash -c "[ -s '$work/demo-native.txt' ] && cmp -s '$work/demo-native.txt' '$work/demo-haswell.txt'"

# A level the CPU lacks is refused, naming ZAYA_CPU; a level it has runs.
ZAYA_CPU=avx512 "$QEMU" -cpu Haswell "$ZAYA" info >"$work/forced.txt" 2>&1
rc=$?
check "ZAYA_CPU=avx512 on a Haswell: exit 1 (got $rc)" test $rc -eq 1
check "ZAYA_CPU=avx512 on a Haswell: the error names ZAYA_CPU and the CPU's best" \
    grep -q "ZAYA_CPU=avx512: this CPU cannot run that kernel level (the highest it can is avx2)" "$work/forced.txt"
ZAYA_CPU=generic "$QEMU" -cpu Haswell "$ZAYA" info >"$work/forced2.txt" 2>&1
check "ZAYA_CPU=generic on a Haswell runs generic" grep -Eq "^kernels +generic \(forced by ZAYA_CPU\)" "$work/forced2.txt"

# The OpenBLAS core (src/kernels/blas_core.h). On this machine, as zaya starts by itself: the core in use has the
# instructions of the kernel level ("blas check ok"; an AVX-512 level on SSE kernels would fail here).
env -u ZAYA_RUNTIME_CONFIGURED "$ZAYA" info >"$work/blas.txt" 2>&1
check "blas check ok on this machine: $(sed -n 's/^blas check *//p' "$work/blas.txt")" grep -q '^blas check *ok:' "$work/blas.txt"
grep -E '^blas (core|cores)' "$work/blas.txt" | sed 's/^/    /'
# A core the user sets wins, and the check says when it does not fit the level.
env -u ZAYA_RUNTIME_CONFIGURED OPENBLAS_CORETYPE=Prescott "$ZAYA" info >"$work/blas-user.txt" 2>&1
check "OPENBLAS_CORETYPE=Prescott is kept" grep -q '^blas core *Prescott (sse kernels): OPENBLAS_CORETYPE=Prescott, set by you' "$work/blas-user.txt"
check "... and reported as a mismatch under the $(sed -n 's/^kernels *\([a-z0-9]*\).*/\1/p' "$work/blas.txt") level" \
    grep -q '^blas check *MISMATCH: sse kernels' "$work/blas-user.txt"
# A CPU the library does not know: a Haswell reporting family 6 model 207 (the Emerald Rapids number), on which
# OpenBLAS 0.3.21 falls back to Prescott. zaya decides inside the emulator and re-executes (the re-executed process
# runs natively: qemu-user does not follow the exec), so its info tells the emulated library's pick and zaya's core.
env -u ZAYA_RUNTIME_CONFIGURED "$QEMU" -cpu Haswell,model=207 "$ZAYA" info 2>/dev/null >"$work/blas-emr.txt"
check "6/207 emulated: OpenBLAS's Prescott replaced by Haswell ($(sed -n 's/^blas core  *//p' "$work/blas-emr.txt"))" \
    grep -q '^blas core *Haswell (avx2 kernels): set by zaya: OpenBLAS picked Prescott (sse kernels) on a CPU whose best kernel level is avx2' "$work/blas-emr.txt"
# A model the library knows keeps its own pick (OMP_WAIT_POLICY is set, so nothing makes zaya re-execute: the check
# runs inside the emulator).
env -u ZAYA_RUNTIME_CONFIGURED "$QEMU" -cpu Haswell "$ZAYA" info 2>/dev/null >"$work/blas-hsw.txt"
check "Haswell emulated: OpenBLAS's own Haswell kept, check ok" \
    bash -c "grep -q '^blas core *Haswell (avx2 kernels): OpenBLAS.s own pick' '$work/blas-hsw.txt' && grep -q '^blas check *ok' '$work/blas-hsw.txt'"
ZAYA_CPU=generic env -u ZAYA_RUNTIME_CONFIGURED "$ZAYA" info >"$work/blas-generic.txt" 2>&1
check "ZAYA_CPU=generic holds OpenBLAS to Nehalem" \
    bash -c "grep -q '^blas core *Nehalem (sse kernels)' '$work/blas-generic.txt' && grep -q '^blas check *ok' '$work/blas-generic.txt'"

ZAYA_CPU=sse9 "$ZAYA" info >"$work/forced3.txt" 2>&1
rc=$?
check "ZAYA_CPU=sse9: exit 1 naming the levels (got $rc)" \
    bash -c "[ $rc -eq 1 ] && grep -q 'ZAYA_CPU=sse9: not a kernel level' '$work/forced3.txt'"
finish
