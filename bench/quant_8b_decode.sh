#!/usr/bin/env bash
# ZAYA1-8B's decoding in bf16, q8 and q4, side by side: the README's quantization table.
#   bash bench/quant_8b_decode.sh DIR [ROUNDS]
# DIR gets 8B (zaya init of configs/zaya1-8b.json, bf16: 17.7 GB), 8B-q8 and 8B-q4 (zaya quantize, groups of 64) when
# missing; then ROUNDS (default 3) rounds of `bench decode` alternating bf16, q8, q4, each folder's pages read first (so
# every run starts from the page cache), at real-time priority where allowed (chrt -f: on a shared machine the other
# jobs then wait rather than the benchmark). Needs ~24 GB of memory for bf16. Output: DIR/decode.log, and a summary of
# this invocation's runs: per dtype the median step, × bf16 (ratio of medians; median of the rounds' own ratios), and
# the share of the bound two ways: the median of the runs' own (each run's bandwidth probed between its steps) and
# against the median bandwidth of every probe of the invocation (the machine's bandwidth, less one probe's noise).
set -euo pipefail
cd "$(dirname "$0")/.."
Z=$PWD/build/zaya
DIR=${1:?usage: bash bench/quant_8b_decode.sh DIR [ROUNDS]}
ROUNDS=${2:-3}
mkdir -p "$DIR"
[ -f "$DIR/8B/config.json" ] || "$Z" init --config configs/zaya1-8b.json --out "$DIR/8B" --dtype bf16 --seed 1
for b in 8 4; do
  [ -f "$DIR/8B-q$b/config.json" ] || "$Z" quantize --model "$DIR/8B" --out "$DIR/8B-q$b" --bits $b --group-size 64
done
RT=""; chrt -f 10 true 2>/dev/null && RT="chrt -f 10"
LOG=$DIR/decode.log
START=$(wc -l < "$LOG" 2>/dev/null || echo 0)
for r in $(seq 1 "$ROUNDS"); do
  for d in 8B:bf16 8B-q8:q8 8B-q4:q4; do
    dir=$DIR/${d%:*}; dt=${d#*:}
    cat "$dir"/*.safetensors > /dev/null
    echo "== round $r $dt $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)" >> "$LOG"
    OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} $RT "$Z" bench decode --model "$dir" --dtype "$dt" --context 128 --tokens 32 >> "$LOG" 2>&1
  done
done
grep -E "^==|^prefill|^decode  " "$LOG"
tail -n +"$((START + 1))" "$LOG" | python3 bench/decode_summary.py
