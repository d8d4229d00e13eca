#!/usr/bin/env bash
# make test-gpu: the GPU suites, on a machine with an NVIDIA GPU. Each suite prints "<suite>: N passed, N failed";
# the closing line sums them ("N passed, N failed").
#   kernels+model  build/zaya_gpu_tests: every gk_ kernel and cuBLASLt product vs its CPU namesake, the whole model
#                  (fp32) vs the CPU path on ZAYA1 and every research variant
#   training       50 bf16 steps of the demo model on the GPU tracking the CPU's loss curve; a GPU checkpoint resumed
#                  on the CPU and a CPU checkpoint on the GPU; an interrupted GPU run resumed bit for bit
#   oracle         zaya forward --device cuda against transformers' ZayaForCausalLM (tests/oracle/test_oracle.py)
#   sanitizer      compute-sanitizer memcheck over a short GPU training run (when compute-sanitizer is installed)
set -uo pipefail
cd "$(dirname "$0")/../.."
Z=build/zaya
W=${ZAYA_GPU_TEST_DIR:-build/gpu-test}
mkdir -p "$W"
total_pass=0
total_fail=0
suite_line() { # name pass fail
    echo "$1: $2 passed, $3 failed"
    total_pass=$((total_pass + $2))
    total_fail=$((total_fail + $3))
}

echo "=== suite: gpu kernels + model"
build/zaya_gpu_tests 2>&1 | tee "$W/kernels.log"
rc=${PIPESTATUS[0]}
line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$W/kernels.log" | tail -n 1)
if [ -z "$line" ]; then suite_line gpu-kernels 0 1; else
    p=${line%% passed*}; f=${line#*, }; f=${f%% failed*}
    [ "$rc" -ne 0 ] && [ "$f" -eq 0 ] && f=1
    suite_line gpu-kernels "$p" "$f"
fi

echo "=== suite: gpu training"
pass=0
fail=0
check() { # name command...
    local name=$1
    shift
    if "$@" >"$W/check.log" 2>&1; then
        echo "  ok   $name"
        case "$1" in python3) sed 's/^/       /' "$W/check.log" | tail -n 1 ;; esac
        pass=$((pass + 1))
    else
        echo "  FAIL $name"; sed 's/^/       /' "$W/check.log" | tail -n 20; fail=$((fail + 1)); fi
}
[ -s runs/demo/data/mathcode/meta.json ] || scripts/demo-data.sh >"$W/demo-data.log" 2>&1
# 50 steps of the demo model, one phase, bf16 products; checkpoints every 25 steps
cat >"$W/run.json" <<'JSON'
{
  "model": "configs/demo-model.json",
  "datasets": {"general": "runs/demo/data/general", "mathcode": "runs/demo/data/mathcode"},
  "phases": [{"name": "web", "tokens": 102400, "seq_len": 128, "mixture": {"general": 0.5, "mathcode": 0.5}}],
  "batch_size": 16, "micro_batch": 8,
  "optimizer": {"lr": 0.01, "weight_decay": 0.01, "grad_clip": 1.0},
  "schedule": {"warmup_steps": 5},
  "checkpoint": {"interval": 25, "keep": 4, "async": false},
  "log_interval": 1, "seed": 7, "precision": "bf16", "out_dir": "OUT"
}
JSON
train() { # out_dir device extra...
    local out=$1 dev=$2
    shift 2
    $Z train "$W/run.json" --quiet --override "out_dir=$out" --device "$dev" "$@"
}
rm -rf "$W"/cpu "$W"/gpu "$W"/gpu-resume "$W"/gpu-to-cpu "$W"/cpu-to-gpu
check "50 bf16 steps on the CPU" train "$W/cpu" cpu
check "50 bf16 steps on the GPU" train "$W/gpu" cuda
check "GPU loss curve tracks the CPU's (50 steps)" python3 tests/gpu/compare_runs.py curve "$W/cpu" "$W/gpu"
# an interrupted GPU run resumed on the GPU: bit-identical to the straight run
check "GPU run stopped at step 25" train "$W/gpu-resume" cuda --stop-after 25
check "GPU run resumed to step 50" train "$W/gpu-resume" cuda --resume
check "GPU resume is bit-identical (metrics and final weights)" python3 tests/gpu/compare_runs.py identical "$W/gpu" "$W/gpu-resume"
# a GPU checkpoint resumed on the CPU, and a CPU checkpoint on the GPU
check "GPU run to step 25, resumed on the CPU" bash -c "$(declare -f train); Z=$Z W=$W; train $W/gpu-to-cpu cuda --stop-after 25 && train $W/gpu-to-cpu cpu --resume"
check "CPU run to step 25, resumed on the GPU" bash -c "$(declare -f train); Z=$Z W=$W; train $W/cpu-to-gpu cpu --stop-after 25 && train $W/cpu-to-gpu cuda --resume"
check "GPU→CPU run tracks the CPU's curve" python3 tests/gpu/compare_runs.py curve "$W/cpu" "$W/gpu-to-cpu"
check "CPU→GPU run tracks the CPU's curve" python3 tests/gpu/compare_runs.py curve "$W/cpu" "$W/cpu-to-gpu"
check "first 25 steps of GPU→CPU equal the GPU run's" python3 tests/gpu/compare_runs.py prefix "$W/gpu" "$W/gpu-to-cpu" 25
suite_line gpu-training "$pass" "$fail"

echo "=== suite: gpu oracle (zaya forward --device cuda vs transformers' ZayaForCausalLM)"
if python3 -c "from transformers import ZayaForCausalLM" >/dev/null 2>&1; then
    ZAYA_BIN=tests/gpu/zaya_on_gpu.sh python3 tests/oracle/test_oracle.py 2>&1 | tee "$W/oracle.log"
    line=$(grep -E '^[a-z_-]+: [0-9]+ passed, [0-9]+ failed' "$W/oracle.log" | tail -n 1)
    if [ -z "$line" ]; then suite_line gpu-oracle 0 1; else
        p=$(echo "$line" | sed -E 's/.*: ([0-9]+) passed.*/\1/'); f=$(echo "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/')
        suite_line gpu-oracle "$p" "$f"
    fi
else
    echo "gpu-oracle: skipped (transformers with ZayaForCausalLM not importable: make deps, or carry a wheel)"
fi

if command -v compute-sanitizer >/dev/null 2>&1; then
    echo "=== suite: gpu sanitizer"
    pass=0
    fail=0
    rm -rf "$W/sanitize"
    check "compute-sanitizer memcheck: 3 GPU training steps, 0 errors" bash -c \
        "compute-sanitizer --tool memcheck --error-exitcode 9 $Z train $W/run.json --quiet --override out_dir=$W/sanitize \
         --override phases.0.tokens=6144 --device cuda"
    suite_line gpu-sanitizer "$pass" "$fail"
else
    echo "gpu-sanitizer: skipped (compute-sanitizer not installed)"
fi

echo
echo "${total_pass} passed, ${total_fail} failed"
[ "$total_fail" -eq 0 ]
