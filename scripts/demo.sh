#!/usr/bin/env bash
# The main job: synthesise the three-phase curriculum corpus, train a byte-level BPE tokenizer, pack the
# datasets into token shards, train a ~2M-parameter ZAYA model through the three phases (about 5-10 minutes on
# 2 cores), evaluate it on the held-out tasks (all of them: 814 unseen 2-digit additions, ...), print samples, and
# leave plots and a loadable checkpoint.
set -euo pipefail
cd "$(dirname "$0")/.."
Z=build/zaya
D=runs/demo
mkdir -p "$D"
step() { printf '\n==> %s\n' "$*"; }

scripts/demo-data.sh

step "training (configs/demo-run.json -> $D/train)"
rm -rf "$D/train"
$Z train configs/demo-run.json

step "evaluation on the held-out tasks"
$Z eval --model "$D/train/final" --tokenizer "$D/tokenizer.json" \
    --task "$D/corpus/eval/addition2.jsonl" "$D/corpus/eval/arith_mc.jsonl" "$D/corpus/eval/code_exec.jsonl" \
           "$D/corpus/eval/general_mc.jsonl" "$D/corpus/eval/kv_recall.jsonl" \
    --shards "$D/data/general" --max-tokens 20000 --seq-len 128 --json "$D/eval.json"

step "samples"
for p in "The old fisherman" "23+45=" "x = 4; y = x * 3; print(y)"; do
    printf -- '--- prompt: %s\n' "$p"
    $Z generate --model "$D/train/final" --tokenizer "$D/tokenizer.json" --prompt "$p" --max-tokens 40 \
        --temperature 0.7 --seed 1
    echo
done

step "done"
echo "model:       $D/train/final  (transformers: ZayaForCausalLM.from_pretrained(\"$D/train/final\"))"
echo "checkpoints: $D/train/checkpoints (resume: build/zaya train configs/demo-run.json --resume)"
echo "plots:       $D/train/loss.png  $D/train/routing.png  $D/train/eval_tasks.png"
echo "metrics:     $D/train/metrics.jsonl   eval: $D/eval.json"
