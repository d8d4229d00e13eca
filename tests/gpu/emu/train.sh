#!/usr/bin/env bash
# zaya itself with its GPU backend on the CPU emulator (build-emu/zaya, GPU_EMU=1): the command-line paths of
# make test-gpu's training suite at a tiny size. bf16 training with --device cuda (the trainer, the optimizer's
# Muon and AdamW on the device, checkpoints) against the CPU's curve; a stopped GPU run resumed bit for bit; GPU
# checkpoint resumed on the CPU; the micro-batches as CUDA graphs bit for bit; generate --device cuda against
# the CPU's greedy tokens; zaya serve --device cuda
# (fp32, a bf16 folder with a bf16 KV cache, and its steps as CUDA graphs) against generate's completions.
# Ends with "gpu-emu-train: N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/../../.." || exit 1
. tests/cli/fixture.sh
suite_begin gpu-emu-train
BUILD=${EMU_BUILD:-build-emu}
ZAYA=$BUILD/zaya
if ! make --no-print-directory -s -j"${EMU_JOBS:-$(nproc 2>/dev/null || echo 2)}" GPU_EMU=1 BUILD="$BUILD" \
    ${ZAYA_STRICT:+WERROR=1} "$ZAYA"; then
    bad "the emulated build of zaya"
    finish
fi
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
export OMP_NUM_THREADS=1
if ! fixture_general_data "$W" 320; then
    bad "data set-up ($fixture_error)"
    finish
fi
fixture_model_json "$W/model.json" 320 256
# 8 bf16 steps of 4 x 32 tokens in two micro-batches, Muon + AdamW, a checkpoint every 4 steps
cat >"$W/run.json" <<JSON
{
  "model": "$W/model.json",
  "datasets": {"general": "$W/data"},
  "phases": [{"name": "web", "tokens": 1024, "seq_len": 32, "mixture": {"general": 1.0}}],
  "batch_size": 4, "micro_batch": 2,
  "optimizer": {"lr": 0.01, "weight_decay": 0.01, "grad_clip": 1.0},
  "schedule": {"warmup_steps": 2},
  "checkpoint": {"interval": 4, "keep": 4, "async": false},
  "log_interval": 1, "seed": 7, "precision": "bf16", "out_dir": "OUT"
}
JSON
train() { # out_dir device extra...
    local out=$1 dev=$2
    shift 2
    $ZAYA train "$W/run.json" --quiet --override "out_dir=$out" --device "$dev" "$@" >>"$W/train.log" 2>&1
}
check "8 bf16 steps on the CPU" train "$W/cpu" cpu
check "8 bf16 steps with --device cuda" train "$W/gpu" cuda
check "the GPU's loss curve tracks the CPU's" python3 tests/gpu/compare_runs.py curve "$W/cpu" "$W/gpu"
check "GPU run stopped at step 4" train "$W/gpu-resume" cuda --stop-after 4
check "GPU run resumed to step 8" train "$W/gpu-resume" cuda --resume
check "GPU resume is bit-identical (metrics and final weights)" \
    python3 tests/gpu/compare_runs.py identical "$W/gpu" "$W/gpu-resume"
train_graphs() { ZAYA_GPU_GRAPHS=1 train "$@"; }
check "8 bf16 steps with each micro-batch as a CUDA graph (ZAYA_GPU_GRAPHS=1)" train_graphs "$W/gpu-graphs" cuda
check "graphs give the launches' run bit for bit (metrics and final weights)" \
    python3 tests/gpu/compare_runs.py identical "$W/gpu" "$W/gpu-graphs"
check "the graphs run's events.log says it takes graphs" grep -q 'CUDA graphs: each micro-batch' "$W/gpu-graphs/events.log"
check "GPU run to step 4, resumed on the CPU" bash -c "$(declare -f train); W=$W ZAYA=$ZAYA; \
    train $W/gpu-to-cpu cuda --stop-after 4 && train $W/gpu-to-cpu cpu --resume"
check "first 4 steps of GPU→CPU equal the GPU run's" python3 tests/gpu/compare_runs.py prefix "$W/gpu" "$W/gpu-to-cpu" 4
gen() { # device: 12 greedy tokens from the CPU run's final weights
    $ZAYA generate --model "$W/cpu/final" --ids --prompt "2 17 5 9" --max-tokens 12 --temperature 0 --device "$1" \
        2>>"$W/train.log"
}
gen_same() { # both must run and print tokens (two failures would print two equal empty strings)
    local a b
    a=$(gen cpu) && b=$(gen cuda) && [ -n "$a" ] && [ "$a" = "$b" ] || { echo "  cpu:  $a"; echo "  cuda: $b"; return 1; }
}
check "generate --device cuda: the CPU's greedy tokens" gen_same
# zaya serve --device cuda over HTTP (tests/gpu/serve_check.py): one at a time and all at once on the GPU's KV block
# pool, prefix cache, forks, echo with log-probabilities, each equal to generate --device cuda's text
# on a model trained longer (on the CPU), so that its greedy texts differ from prompt to prompt
sed -e 's/"tokens": 1024/"tokens": 32768/' -e 's/"precision": "bf16"/"precision": "fp32"/' "$W/run.json" >"$W/long.json"
check "256 steps on the CPU for the served model" \
    $ZAYA train "$W/long.json" --quiet --override "out_dir=$W/long" --device cpu >>"$W/train.log" 2>&1
serve() { python3 tests/gpu/serve_check.py "$ZAYA" "$@" >>"$W/train.log" 2>&1; }
check "serve --device cuda (f32): generate's completions" serve "$W/long/final" "$W/tok.json" --dtype f32
check "zaya convert the trained model to bf16" $ZAYA convert --model "$W/long/final" --out "$W/final-bf16" --dtype bf16
check "serve --device cuda, bf16 folder, bf16 KV cache: generate's completions" serve "$W/final-bf16" "$W/tok.json" \
    --dtype auto --kv-dtype bf16
check "serve --device cuda with the steps as CUDA graphs (ZAYA_GPU_GRAPHS=1): generate's completions" \
    env ZAYA_GPU_GRAPHS=1 python3 tests/gpu/serve_check.py "$ZAYA" "$W/final-bf16" "$W/tok.json" --dtype auto
[ "$fail" -eq 0 ] || tail -n 30 "$W/train.log"
finish
