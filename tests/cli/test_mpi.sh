#!/usr/bin/env bash
# Data parallelism under Open MPI: mpirun -np N with per-rank micro-batch b matches -np 1 with micro-batch N·b
# (same global batch) within 1e-4 relative at every step's loss and in the final weights; checkpoints saved by N
# ranks resume on M ranks (4→2, 2→1, 1→2, 2→3) and match the un-reshaped run; bad launches fail on every rank
# without hanging.
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/fixture.sh"
cd "$(dirname "$0")/../.."
ZAYA=$PWD/build/zaya
W=$(mktemp -d /tmp/zaya_mpi_test.XXXXXX)
trap 'rm -rf "$W"' EXIT
suite_begin mpi
if ! command -v mpirun >/dev/null; then bad "mpirun not installed"; finish; fi
fixture_mpi_env
MPI="timeout 120 mpirun --oversubscribe"

fixture_general_data "$W" 300 || { bad "data"; finish; }
fixture_model_json "$W/model.json" 300 64
# 20 steps of a global batch of 24 sequences; checkpoint at step 10
cat >"$W/run.json" <<JSON
{"model": "$W/model.json", "datasets": {"general": "$W/data"},
 "phases": [{"name": "p", "tokens": 15360, "seq_len": 32, "mixture": {"general": 1}}],
 "batch_size": 24, "micro_batch": 24, "optimizer": {"lr": 0.01, "weight_decay": 0.01},
 "checkpoint": {"interval": 10, "keep": 5}, "eval": {"interval": 10, "val_batches": 1}, "seed": 7, "out_dir": "$W/np1"}
JSON
cat >"$W/cmp.py" <<'PY'
import json, sys, numpy as np
from safetensors.numpy import load_file
a, b = sys.argv[1], sys.argv[2]
la = [json.loads(l)["loss"] for l in open(a + "/metrics.jsonl") if '"train"' in l]
lb = [json.loads(l)["loss"] for l in open(b + "/metrics.jsonl") if '"train"' in l]
if len(la) != len(lb):
    print(f"step counts differ: {len(la)} vs {len(lb)}"); sys.exit(1)
le = max(abs(x - y) / abs(x) for x, y in zip(la, lb))
wa, wb = load_file(a + "/final/model.safetensors"), load_file(b + "/final/model.safetensors")
we = max(np.linalg.norm(wa[k] - wb[k]) / max(np.linalg.norm(wa[k]), 1e-30) for k in wa)
print(f"{len(la)} steps, loss max rel err {le:.1e}, weights max rel err {we:.1e}")
sys.exit(0 if le <= 1e-4 and we <= 1e-4 else 1)
PY

$ZAYA train "$W/run.json" --quiet >"$W/np1.log" 2>&1 || { bad "np 1 run"; cat "$W/np1.log"; finish; }
for np in 2 4; do
    out="$W/np$np"
    if $MPI -np $np $ZAYA train "$W/run.json" --override micro_batch=$((24 / np)) --override out_dir="$out" --quiet \
        >"$out.log" 2>&1; then
        r=$(python3 "$W/cmp.py" "$W/np1" "$out") && ok "np $np (micro $((24 / np))) vs np 1 (micro 24): $r" ||
            bad "np $np vs np 1: $r"
    else
        bad "np $np run: $(tail -3 "$out.log")"
    fi
done
test "$(ls "$W/np4/checkpoints/step-00000010" | grep -c '^optimizer-')" -eq 4 && ok "np 4 checkpoint has 4 optimizer shards" ||
    bad "np 4 checkpoint shards: $(ls "$W/np4/checkpoints/step-00000010")"

# zaya ckpt inspect / export on the 4-rank checkpoint
ck="$W/np4/checkpoints/step-00000010"
if $ZAYA ckpt inspect "$ck" >"$W/inspect.txt" 2>&1 && grep -q "world size  4" "$W/inspect.txt" &&
    grep -q "all files verified" "$W/inspect.txt" && [ "$(grep -c '^optimizer-0000[0-3]-of-00004.safetensors .* ok$' "$W/inspect.txt")" -eq 4 ]; then
    ok "ckpt inspect: world size 4, 4 optimizer shards, checksums verified"
else
    bad "ckpt inspect: $(cat "$W/inspect.txt")"
fi
if $ZAYA ckpt export "$W/np4/checkpoints" --out "$W/hf" >/dev/null 2>&1 &&
    python3 -c "
import sys, torch
from transformers import ZayaForCausalLM
m, info = ZayaForCausalLM.from_pretrained('$W/hf', output_loading_info=True)
sys.exit(1 if any(info[k] for k in ('missing_keys', 'unexpected_keys', 'mismatched_keys')) else 0)" 2>/dev/null; then
    ok "ckpt export: a plain Hugging Face directory that transformers loads without missing or unexpected keys"
else
    bad "ckpt export"
fi
cp -r "$ck" "$W/ck_bad"
printf '\x01' | dd of="$W/ck_bad/optimizer-00002-of-00004.safetensors" bs=1 seek=300 conv=notrunc status=none
if $ZAYA ckpt inspect "$W/ck_bad" >"$W/inspect_bad.txt" 2>&1; then
    bad "ckpt inspect accepted a corrupt shard"
else
    grep -q "optimizer-00002-of-00004.safetensors .*CRC" "$W/inspect_bad.txt" && ok "ckpt inspect flags the corrupt shard" ||
        bad "ckpt inspect corrupt: $(cat "$W/inspect_bad.txt")"
fi

# reshaping: save with N ranks at step 10, resume with M, compare with the straight np-1 run
for pair in 4:2 2:1 1:2 2:3; do
    n=${pair%:*} m=${pair#*:}
    out="$W/reshape_${n}_${m}"
    $MPI -np $n $ZAYA train "$W/run.json" --override micro_batch=$((24 / n)) --override out_dir="$out" --stop-after 10 \
        --quiet >"$out.log" 2>&1 &&
        $MPI -np $m $ZAYA train "$W/run.json" --override micro_batch=$((24 / m)) --override out_dir="$out" --resume \
            --quiet >>"$out.log" 2>&1 || { bad "reshape $n→$m: $(tail -3 "$out.log")"; continue; }
    r=$(python3 "$W/cmp.py" "$W/np1" "$out") && ok "checkpoint from $n ranks resumed on $m: $r" || bad "reshape $n→$m: $r"
done

# bad launches: an error on every rank, non-zero exit, no hang
out="$W/bad1"
if $MPI -np 5 $ZAYA train "$W/run.json" --override out_dir="$out" --quiet >"$out.log" 2>&1; then
    bad "5 ranks for a batch of 24 was accepted"
else
    grep -q "must be a multiple of ranks x micro_batch" "$out.log" && ok "batch not divisible by 5 ranks: clean error" ||
        bad "5 ranks: $(tail -2 "$out.log")"
fi
out="$W/bad2"
if $MPI -np 1 $ZAYA train "$W/run.json" --override micro_batch=12 --override out_dir="$out" --quiet : \
    -np 1 $ZAYA train "$W/run.json" --override micro_batch=12 --override out_dir="$out" --override optimizer.lr=0.02 \
    --quiet >"$out.log" 2>&1; then
    bad "ranks with different configs were accepted"
else
    grep -q "run config differs between ranks" "$out.log" && ok "mismatched configs across ranks: clean error" ||
        bad "mismatched configs: $(tail -2 "$out.log")"
fi
out="$W/reshape_2_3"
rm -f "$out/checkpoints/step-00000010/optimizer-00001-of-00002.safetensors"
echo "step-00000010" >"$out/checkpoints/latest"
if $MPI -np 2 $ZAYA train "$W/run.json" --override micro_batch=12 --override out_dir="$out" \
    --resume-from "$out/checkpoints/step-00000010" --quiet >"$out.missing.log" 2>&1; then
    bad "a missing optimizer shard was accepted"
else
    grep -q "optimizer-00001-of-00002.safetensors" "$out.missing.log" && ok "missing optimizer shard: clean error" ||
        bad "missing shard: $(tail -2 "$out.missing.log")"
fi
# a rank killed with SIGKILL: the job ends within a bounded time (no rank left waiting in a collective)
out="$W/killed"
$MPI -np 2 $ZAYA train "$W/run.json" --override micro_batch=12 --override out_dir="$out" \
    --override phases.0.tokens=15360000 --override checkpoint.interval=0 --quiet >"$out.log" 2>&1 &
job=$!
for _ in $(seq 1 300); do [ -s "$out/metrics.jsonl" ] && break; sleep 0.05; done
victim=$(pgrep -f "^$ZAYA train .*$out" | tail -1)
if [ -z "$victim" ]; then
    bad "kill test: no rank found"
    kill $job 2>/dev/null
else
    t0=$(date +%s.%N)
    kill -9 "$victim"
    wait $job
    rc=$?
    dt=$(python3 -c "print(round($(date +%s.%N) - $t0, 1))")
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && python3 -c "import sys; sys.exit(not $dt < 30)"; then
        ok "rank $victim killed: the job ended in ${dt} s with status $rc"
    else
        bad "rank killed: status $rc after ${dt} s"
    fi
fi
finish
