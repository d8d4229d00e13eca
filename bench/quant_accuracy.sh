#!/usr/bin/env bash
# docs/quantization.md's accuracy tables, from scratch: the demo data, the two trained models (the demo model cut to
# 0.9 M tokens: bench/quant_demo_run.json; bench-medium's widths with the demo vocabulary: bench/quant_medium_run.json),
# then bench/quant_accuracy.py on each (bf16, q8 and q4 at groups of 32/64/128 by mlx's rule and mse, and calibrated on
# the general data's train split by mse and GPTQ; on the demo model also q4 with the router at 4 bits and one class of
# matrices at a time). Results are appended to bench/results/$OUT.
#   bash bench/quant_accuracy.sh [demo|medium|both]      (set SKIP_TRAIN=1 to reuse runs/quant-*/train/final)
set -euo pipefail
cd "$(dirname "$0")/.."
WHICH=${1:-both}
OUT=bench/results/${OUT:-quant-accuracy-zen3-$(date -u +%F).txt}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
D=runs/demo
[ -f "$D/data/general/meta.json" ] || scripts/demo-data.sh
machine="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) (family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | xargs) model $(grep -m1 '^model' /proc/cpuinfo | cut -d: -f2 | xargs)), $(nproc) CPUs, $(free -g | awk '/Mem:/{print $2}') GB, load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%FT%TZ)"
tasks="$D/corpus/eval/addition2.jsonl,$D/corpus/eval/arith_mc.jsonl,$D/corpus/eval/general_mc.jsonl"
run() { # name, run config, extra args
    local name=$1 cfg=$2; shift 2
    local model=runs/quant-$name/train/final
    if [ -z "${SKIP_TRAIN:-}" ] || [ ! -f "$model/config.json" ]; then
        rm -rf "runs/quant-$name/train"
        build/zaya train "$cfg"
    fi
    python3 bench/quant_accuracy.py --model "$model" --data "$D/data/general" --tokenizer "$D/tokenizer.json" \
        --tasks "$tasks" --limit 200 --speed --work "runs/quant-$name/q" --out "$OUT" \
        --calibration "$D/data/general" --calibration-methods mse,gptq --label "$name model ($cfg), $machine" "$@"
}
case $WHICH in
demo) run demo bench/quant_demo_run.json --router-4bit --classes ;;
medium) run medium bench/quant_medium_run.json ;;
both) run demo bench/quant_demo_run.json --router-4bit --classes; run medium bench/quant_medium_run.json ;;
*) echo "usage: bash bench/quant_accuracy.sh [demo|medium|both]" >&2; exit 2 ;;
esac
echo "tables appended to $OUT"
