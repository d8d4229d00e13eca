#!/usr/bin/env bash
# The demo's data: the synthetic three-phase curriculum corpus, a byte-level BPE tokenizer trained on it, and its
# token shards, in runs/demo/ (corpus/, tokenizer.json, data/{general,mathcode,longctx}). scripts/demo.sh and the
# shipped ablations (configs/ablation-*.json) train on it. Deterministic: the same files on every run.
set -euo pipefail
cd "$(dirname "$0")/.."
Z=build/zaya
D=runs/demo
mkdir -p "$D"
step() { printf '\n==> %s\n' "$*"; }

step "synthetic curriculum corpus ($D/corpus)"
rm -rf "$D/corpus"
$Z data synth --out "$D/corpus" --seed 0

step "tokenizer ($D/tokenizer.json)"
$Z tokenizer train --input "$D/corpus/general.jsonl" "$D/corpus/mathcode.jsonl" "$D/corpus/longctx.jsonl" \
    --vocab-size 1024 --split-digits --out "$D/tokenizer.json"

step "token shards ($D/data)"
for d in general mathcode longctx; do
    $Z data prepare --tokenizer "$D/tokenizer.json" --input "$D/corpus/$d.jsonl" --out "$D/data/$d" \
        --val-fraction 0.02 --bos --force
done

