#!/usr/bin/env bash
# zaya bench train --micro-batches K (gradient accumulation) runs the training run's own step: on the same data and
# seed, its per-step losses equal those of a RUN.json run with micro_batch B and batch_size K·B, bit for bit (the
# same StepBackend, accumulation and arithmetic on one CPU process; both print the loss exactly); bad K is refused.
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/fixture.sh"
cd "$(dirname "$0")/../.."
ZAYA=build/zaya
W=$(mktemp -d /tmp/zaya_bench_train_test.XXXXXX)
trap 'rm -rf "$W"' EXIT
suite_begin bench-train
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

fixture_general_data "$W" 384 || { bad "$fixture_error"; finish; }
fixture_model_json "$W/model.json" 384 64
ok "tiny corpus, tokenizer, shards and model"

# 2 micro-batches of 3 x 16 tokens a step, 4 steps (1 warm-up + 3 timed in the benchmark); constant lr 1e-3, clip 1,
# no balancing controller and router_lr_scale 1: what bench train's optimizer does
B=3 K=2 T=16 S=5
cat >"$W/run.json" <<JSON
{"model": "$W/model.json", "datasets": {"general": "$W/data"},
 "phases": [{"name": "p", "tokens": $((4 * B * K * T)), "seq_len": $T, "mixture": {"general": 1.0}}],
 "batch_size": $((B * K)), "micro_batch": $B,
 "optimizer": {"lr": 0.001, "router_lr_scale": 1, "grad_clip": 1.0}, "schedule": {"type": "constant"},
 "balancing": {"enabled": false}, "checkpoint": {"interval": 0}, "eval": {"interval": 0},
 "seed": $S, "out_dir": "$W/run"}
JSON
$ZAYA train "$W/run.json" --quiet >"$W/train.log" 2>&1 || { bad "train: $(tail -n 5 "$W/train.log")"; finish; }
ok "RUN.json training with micro_batch $B, batch_size $((B * K))"

bench=($ZAYA bench train --config "$W/model.json" --batch $B --seq $T --steps 3 --warmup 1 --data "$W/data"
       --seed $S --optimizer muon)
"${bench[@]}" --micro-batches $K >"$W/bench.txt" 2>&1 || { bad "bench train: $(tail -n 5 "$W/bench.txt")"; finish; }
grep -q "^batch  *2 micro-batches of 3 x 16 = 96 tokens per optimizer step" "$W/bench.txt" &&
    grep -q "^throughput  *[0-9]* tokens/s over whole optimizer steps" "$W/bench.txt" &&
    ok "bench train: tokens per optimizer step and tokens/s over whole steps" ||
    bad "bench train output: $(head -n 8 "$W/bench.txt")"

same_losses() { # METRICS BENCH_OUTPUT: every train row's loss == the bench's, exactly
    python3 - "$1" "$2" <<'PY'
import json, sys
train = [json.loads(l)["loss"] for l in open(sys.argv[1]) if '"kind":"train"' in l.replace(" ", "")]
bench = [float(x) for l in open(sys.argv[2]) if l.startswith("losses") for x in l.split()[1:]]
print("train", train, "\nbench", bench)
sys.exit(len(train) != 4 or train != bench)
PY
}
same_losses "$W/run/metrics.jsonl" "$W/bench.txt" >"$W/cmp.txt" &&
    ok "bench train --micro-batches $K: the RUN.json run's 4 losses, bit for bit" ||
    bad "loss trajectories differ: $(cat "$W/cmp.txt")"
# the check can fail: one micro-batch a step reads other rows and takes other steps
"${bench[@]}" --micro-batches 1 >"$W/bench1.txt" 2>&1 && ! same_losses "$W/run/metrics.jsonl" "$W/bench1.txt" \
    >/dev/null && ok "--micro-batches 1 gives another trajectory" || bad "--micro-batches 1: $(tail -n 3 "$W/bench1.txt")"

for k in 0 -2 2.5 two; do
    if "${bench[@]}" --micro-batches $k >"$W/bad.txt" 2>&1; then
        bad "--micro-batches $k accepted"
    elif grep -q -- "--micro-batches" "$W/bad.txt" && grep -qE "positive integer|expects an integer" "$W/bad.txt"; then
        ok "--micro-batches $k: $(tail -n 1 "$W/bad.txt" | cut -c1-110)"
    else
        bad "--micro-batches $k: $(cat "$W/bad.txt")"
    fi
done
$ZAYA bench train --config "$W/model.json" --seq 16 --data "$W/nowhere" --steps 1 --warmup 0 >"$W/bad.txt" 2>&1 &&
    bad "--data of a missing folder accepted" ||
    { grep -q -- "--data" "$W/bad.txt" && ok "--data of a missing folder: names the flag" || bad "--data: $(cat "$W/bad.txt")"; }
finish
