#!/usr/bin/env bash
# zaya ablate on a tiny model: every variant family trains (MHA/GQA attention, linear router, no skip expert, dense
# MLP, plain residuals) and the report has one row each with its parameter counts and KV bytes; a second run skips
# what finished; a run stopped half-way resumes from its checkpoint and ends where an unbroken run ends; SIGINT
# stops cleanly (exit 130, checkpoint kept) and the next call finishes; bad specs fail with the key named; a research
# variant's checkpoint refuses `ckpt export`.
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/fixture.sh"
cd "$(dirname "$0")/../.."
ZAYA=build/zaya
W=$(mktemp -d /tmp/zaya_ablate_test.XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$W"' EXIT
suite_begin ablate
export OMP_NUM_THREADS=1

fixture_all_data "$W" 384 || { bad "$fixture_error"; finish; }
fixture_model_json "$W/model.json" 384 128
cat >"$W/run.json" <<JSON
{"model": "$W/model.json", "tokenizer": "$W/tok.json",
 "datasets": {"general": "$W/data/general", "mathcode": "$W/data/mathcode"},
 "phases": [{"name": "web", "tokens": 3072, "seq_len": 32, "mixture": {"general": 0.7, "mathcode": 0.3}}],
 "batch_size": 8, "micro_batch": 8,
 "optimizer": {"lr": 0.01, "weight_decay": 0.01, "grad_clip": 1.0},
 "schedule": {"type": "wsd", "warmup_steps": 2, "decay_fraction": 0.3},
 "checkpoint": {"interval": 4, "keep": 2}, "eval": {"interval": 6, "val_batches": 1},
 "log_interval": 4, "seed": 1, "out_dir": "$W/unused"}
JSON
# 12 steps per run
cat >"$W/spec.json" <<JSON
{"run": "$W/run.json", "out_dir": "$W/abl", "seeds": [1, 2],
 "run_overrides": {"checkpoint": {"interval": 3}},
 "variants": [
   {"name": "zaya", "model": {}},
   {"name": "mha", "model": {"zaya_attention": "mha", "num_key_value_heads": 4}},
   {"name": "gqa", "model": {"zaya_attention": "mha"}},
   {"name": "linear", "model": {"zaya_router": "linear"}},
   {"name": "noskip", "model": {"zaya_moe": "noskip"}},
   {"name": "dense", "model": {"zaya_moe": "dense"}},
   {"name": "plain", "model": {"zaya_residual_scaling": false}}]}
JSON
$ZAYA ablate "$W/spec.json" >"$W/ablate.log" 2>&1
rc=$?
check "ablate: 7 variants x 2 seeds train to the end (exit 0)" test $rc -eq 0
[ $rc -eq 0 ] || tail -20 "$W/ablate.log"
md="$W/abl/ablation.md"
check "ablation.md, ablation.json and ablation.png written" test -s "$md" -a -s "$W/abl/ablation.json" -a -s "$W/abl/ablation.png"
for v in zaya mha gqa linear noskip dense plain; do
    check "ablation.md has a row for $v with a val loss" grep -qE "^\| $v \| .*\| [0-9]+\.[0-9]{4} ± [0-9.]+ \|" "$md"
done
check "the research variants are marked not exportable, ZAYA1 exportable" \
    bash -c "grep -q '^| mha .*no (research variant) |' '$md' && grep -q '^| zaya .*| yes |' '$md'"
# parameters and KV bytes: MHA with 4 kv heads caches 2x the GQA/ZAYA bytes; dense has total == active
python3 - "$W/abl/ablation.json" <<'PY' >"$W/json.log" 2>&1
import json, sys
j = json.load(open(sys.argv[1]))
v = {x["name"]: x for x in j["variants"]}
assert v["mha"]["kv_bytes_per_token_bf16"] == 2 * v["gqa"]["kv_bytes_per_token_bf16"] == 2 * v["zaya"]["kv_bytes_per_token_bf16"]
assert v["dense"]["params_total"] == v["dense"]["params_active"]
assert v["zaya"]["params_total"] > v["zaya"]["params_active"]
assert v["linear"]["params_total"] < v["zaya"]["params_total"]
assert v["plain"]["params_total"] == v["zaya"]["params_total"] - 2 * 8 * 32   # 8 residual vectors of 32 per layer
for x in j["variants"]:
    assert len(x["runs"]) == 2 and all(r["done"] and r["steps"] == 12 for r in x["runs"]), x["name"]
    assert x["exportable"] == (x["name"] == "zaya")
print("ok")
PY
check "ablation.json: counts, KV bytes, exportability, every run 12 steps" grep -qx ok "$W/json.log"
[ "$(cat "$W/json.log")" = ok ] || cat "$W/json.log"
# each run is a plain training run with its own config
check "each run has run.json, metrics and a final model" \
    test -s "$W/abl/noskip/seed-2/run.json" -a -s "$W/abl/noskip/seed-2/metrics.jsonl" -a -s "$W/abl/noskip/seed-2/final/config.json"
check "the variant's model.json carries its zaya_* keys" grep -q '"zaya_moe":[[:space:]]*"noskip"' "$W/abl/noskip/model.json"

# again: everything is finished, nothing trains
cp "$W/abl/dense/seed-1/final/model.safetensors" "$W/dense1.safetensors"
$ZAYA ablate "$W/spec.json" >"$W/again.log" 2>&1
check "second call: exit 0, all 14 runs skipped" \
    bash -c "test \$(grep -c 'finished earlier' '$W/again.log') -eq 14 && ! grep -q ': training' '$W/again.log'"

# a half-done run resumes: stop one after 5 steps by hand, then ablate finishes it == the unbroken run
rm -rf "$W/abl/dense/seed-1"
$ZAYA ablate "$W/spec.json" --dry-run >/dev/null 2>&1
$ZAYA train "$W/abl/dense/seed-1/run.json" --stop-after 5 --quiet >/dev/null 2>&1
$ZAYA ablate "$W/spec.json" >"$W/resume.log" 2>&1
check "half-done run: ablate resumes it from its checkpoint" grep -q "dense seed 1: resuming" "$W/resume.log"
check "half-done run: final weights == the unbroken run's" cmp -s "$W/dense1.safetensors" "$W/abl/dense/seed-1/final/model.safetensors"

# SIGINT while a run trains: exit 130, checkpoint kept, report of what finished; the next call completes
cat >"$W/spec2.json" <<JSON
{"run": "$W/run.json", "out_dir": "$W/abl2", "seeds": [3],
 "run_overrides": {"phases": [{"name": "web", "tokens": 40000, "seq_len": 32, "mixture": {"general": 1}}],
                   "checkpoint": {"interval": 2}},
 "variants": [{"name": "a", "model": {}}, {"name": "b", "model": {"zaya_moe": "noskip"}}]}
JSON
$ZAYA ablate "$W/spec2.json" >"$W/int.log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do [ -e "$W/abl2/a/seed-3/checkpoints/latest" ] && break; sleep 0.05; done
kill -INT $pid
wait $pid
rc=$?
check "SIGINT: exit 130" test $rc -eq 130
check "SIGINT: says how to go on" grep -q "run \`zaya ablate .*\` again" "$W/int.log"
check "SIGINT: the interrupted run kept its checkpoint" test -e "$W/abl2/a/seed-3/checkpoints/latest"
$ZAYA ablate "$W/spec2.json" >"$W/int2.log" 2>&1
check "after SIGINT: the next call resumes and finishes both" \
    bash -c "grep -q 'a seed 3: resuming' '$W/int2.log' && test -s '$W/abl2/b/seed-3/final/config.json' && test -s '$W/abl2/ablation.md'"

# research variants do not export; ZAYA1 does
$ZAYA ckpt export "$W/abl/mha/seed-1/checkpoints" --out "$W/export-mha" >"$W/exp.log" 2>&1
rc=$?
check "ckpt export of an MHA variant: refused, saying why" \
    bash -c "test $rc -ne 0 && grep -q 'research variant' '$W/exp.log' && ! test -e '$W/export-mha/model.safetensors'"
check "ckpt export of the ZAYA1 run works" \
    bash -c "$ZAYA ckpt export '$W/abl/zaya/seed-1/checkpoints' --out '$W/export-zaya' >/dev/null"
check "a research variant generates from its final model" \
    bash -c "$ZAYA generate --model '$W/abl/gqa/seed-1/final' --tokenizer '$W/tok.json' --prompt The --max-tokens 5 --seed 1 >/dev/null 2>&1"

# bad specs: the file and the key are named, nothing runs
bad_spec() { # NAME JSON EXPECTED
    echo "$2" >"$W/bad.json"
    $ZAYA ablate "$W/bad.json" >"$W/bad.log" 2>&1
    local rc=$?
    check "bad spec ($1): exit 1, message names it" bash -c "test $rc -eq 1 && grep -q -- '$3' '$W/bad.log'"
}
bad_spec "unknown key" "{\"run\": \"$W/run.json\", \"out_dir\": \"$W/b\", \"variants\": [{\"name\": \"a\"}], \"seed\": 1}" 'unknown key "seed"'
bad_spec "missing run" "{\"run\": \"$W/nope.json\", \"out_dir\": \"$W/b\", \"variants\": [{\"name\": \"a\"}]}" 'key "run"'
bad_spec "bad variant name" "{\"run\": \"$W/run.json\", \"out_dir\": \"$W/b\", \"variants\": [{\"name\": \"../x\"}]}" 'variants\[0\].name'
bad_spec "duplicate name" "{\"run\": \"$W/run.json\", \"out_dir\": \"$W/b\", \"variants\": [{\"name\": \"a\"}, {\"name\": \"a\"}]}" 'used twice'
bad_spec "bad model key" "{\"run\": \"$W/run.json\", \"out_dir\": \"$W/b\", \"variants\": [{\"name\": \"a\", \"model\": {\"zaya_moe\": \"huge\"}}]}" 'variant "a".*zaya_moe'
bad_spec "duplicate seed" "{\"run\": \"$W/run.json\", \"out_dir\": \"$W/b\", \"seeds\": [1, 1], \"variants\": [{\"name\": \"a\"}]}" 'listed twice'
bad_spec "bad run override" "{\"run\": \"$W/run.json\", \"out_dir\": \"$W/b\", \"run_overrides\": {\"batch_size\": -3}, \"variants\": [{\"name\": \"a\"}]}" 'batch_size'
check "bad specs created no output directory" test ! -e "$W/b"
finish
