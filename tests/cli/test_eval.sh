#!/usr/bin/env bash
# CLI test of `zaya eval` (and `zaya generate` in text mode): a tokenizer trained on a tiny corpus, a tiny model,
# multiple-choice and exact-match task files, held-out tokens (.npy and shards); checks the table, the JSON, --limit, determinism
# and the error paths (a malformed line is reported as file:line). Ends with "eval: N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/../.."
ZAYA=${ZAYA_BIN:-build/zaya}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
pass=0
fail=0
check() { # check NAME CONDITION-STATUS [DETAIL]
    if [ "$2" -eq 0 ]; then
        pass=$((pass + 1))
        echo "  ok   $1"
    else
        fail=$((fail + 1))
        echo "  FAIL $1${3:+: $3}"
    fi
}
finish() {
    echo "eval: ${pass} passed, ${fail} failed"
    [ "$fail" -eq 0 ]
    exit
}
if [ ! -x "$ZAYA" ]; then
    check "setup" 1 "$ZAYA not built (run make)"
    finish
fi
work=$(mktemp -d /tmp/zaya-eval-cli.XXXXXX)
trap 'rm -rf "$work"' EXIT

# --- setup: tokenizer, model (vocabulary above the tokenizer's), task files, held-out tokens -------------------
for i in 1 2 3 4 5 6; do
    cat <<'EOF'
The quick brown fox jumps over the lazy dog. The capital of France is Paris.
A cat sat on the mat. Two plus two is four. The sky is blue and the grass is green.
EOF
done >"$work/corpus.txt"
"$ZAYA" tokenizer train --input "$work/corpus.txt" --vocab-size 300 --out "$work/tok.json" >/dev/null 2>&1
check "setup tokenizer" $?
sed -e 's/"vocab_size": *[0-9]*/"vocab_size": 320/' -e 's/"bos_token_id": *[0-9]*/"bos_token_id": 1/' \
    -e 's/"eos_token_id": *[0-9]*/"eos_token_id": 2/' configs/tiny.json >"$work/cfg.json"
"$ZAYA" init --config "$work/cfg.json" --out "$work/model" --seed 3 >/dev/null 2>&1
check "setup model" $?
cat >"$work/mc.jsonl" <<'EOF'
{"context": "The capital of France is", "choices": [" Paris", " a dog", " blue"], "answer": 0}

{"context": "Two plus two is ", "choices": ["four", "green", "the mat"], "answer": 0}
{"context": "A cat sat on the", "choices": [" mat", " sky"], "answer": 0}
EOF
cat >"$work/qa.jsonl" <<'EOF'
{"prompt": "The sky is", "answer": "blue"}
{"prompt": "A cat sat on the", "answer": "mat"}
EOF
"$ZAYA" tokenizer encode --tokenizer "$work/tok.json" --input "$work/corpus.txt" --out "$work/held.npy" >/dev/null 2>&1
check "setup held-out tokens" $?

# --- the table ---------------------------------------------------------------------------------------------------
out=$("$ZAYA" eval --model "$work/model" --tokenizer "$work/tok.json" --task "$work/mc.jsonl" "$work/qa.jsonl" \
    --tokens "$work/held.npy" --seq-len 32 --json "$work/res.json" 2>"$work/err")
rc=$?
check "eval runs" $rc "$(tail -3 "$work/err")"
echo "$out" | sed 's/^/    /'
echo "$out" | head -1 | grep -Eq '^task +type +n +acc +acc_norm/em +ppl$'
check "table header" $?
echo "$out" | grep -Eq '^mc +mc +3 +[01]\.[0-9]{4} +[01]\.[0-9]{4} +[0-9]+\.[0-9]{4}$'
check "mc row: n=3, acc, acc_norm, ppl" $?
echo "$out" | grep -Eq '^qa +exact +2 +- +[01]\.[0-9]{4} +-$'
check "exact-match row" $?
echo "$out" | grep -Eq '^held\.npy +loss +[0-9]+ +- +- +[0-9]+\.[0-9]{4} +\(loss [0-9]+\.[0-9]+\)$'
check "held-out row" $?
python3 - "$work/res.json" <<'EOF'
import json, math, sys
r = json.load(open(sys.argv[1]))
t = {x["task"]: x for x in r["tasks"]}
assert t["mc"]["type"] == "mc" and t["mc"]["n"] == 3 and 0 <= t["mc"]["acc"] <= 1 and t["mc"]["ppl"] > 1
assert t["qa"]["type"] == "exact" and "exact_match" in t["qa"] and "acc" not in t["qa"]
h = r["heldout"]
assert h["tokens"] > 0 and abs(math.exp(h["loss"]) - h["ppl"]) < 1e-6 * h["ppl"]
assert r["weights"] == "f32"
EOF
check "json results" $?

out2=$("$ZAYA" eval --model "$work/model" --tokenizer "$work/tok.json" --task "$work/mc.jsonl" "$work/qa.jsonl" \
    --tokens "$work/held.npy" --seq-len 32 2>/dev/null)
[ "$out" = "$out2" ]
check "deterministic" $?

out=$("$ZAYA" eval --model "$work/model" --tokenizer "$work/tok.json" --task "$work/mc.jsonl" --limit 1 2>/dev/null)
echo "$out" | grep -Eq '^mc +mc +1 '
check "--limit" $?

out=$("$ZAYA" eval --model "$work/model" --tokens "$work/held.npy" --seq-len 16 --max-tokens 40 2>/dev/null)
echo "$out" | grep -Eq '^held\.npy +loss +40 '
check "--max-tokens" $?

# --- BOS / EOS by name, as transformers (tokenizer_config.json, else the special tokens): the model config below
# says bos 5 / eos 6, so a tokenizer whose <bos> / <eos> went unfound would score otherwise ------------------------
cp -r "$work/model" "$work/model56"
sed -i -e 's/"bos_token_id":[[:space:]]*[0-9]*/"bos_token_id": 5/' -e 's/"eos_token_id":[[:space:]]*[0-9]*/"eos_token_id": 6/' \
    "$work/model56/config.json"
mkdir -p "$work/gemma" "$work/other"
sed -e 's/<|bos|>/<bos>/g' -e 's/<|eos|>/<eos>/g' "$work/tok.json" >"$work/gemma/tokenizer.json"
printf '{"bos_token": "<bos>", "eos_token": {"content": "<eos>"}}\n' >"$work/gemma/tokenizer_config.json"
sed -e 's/<|bos|>/<start>/g' -e 's/<|eos|>/<stop>/g' "$work/tok.json" >"$work/other/tokenizer.json"
T2=(--task "$work/mc.jsonl" "$work/qa.jsonl")
# the scores only (stdout): stderr's progress lines carry timings that differ from run to run
a=$("$ZAYA" eval --model "$work/model56" --tokenizer "$work/tok.json" "${T2[@]}" 2>/dev/null)
b=$("$ZAYA" eval --model "$work/model56" --tokenizer "$work/gemma" "${T2[@]}" 2>/dev/null)
c=$("$ZAYA" eval --model "$work/model56" --tokenizer "$work/other" "${T2[@]}" 2>/dev/null)
[ -n "$a" ] && [ "$a" = "$b" ] && [ "$a" != "$c" ]
check "eval: <bos>/<eos> named by tokenizer_config.json act as <|bos|>/<|eos|> (unnamed ones: the model config's)" $? \
    "$a / $b / $c"

# --- the synthetic curriculum's eval tasks (zaya data synth) load and score; long prompts are cut from the left -
if "$ZAYA" data synth --out "$work/synth" --scale 0.01 >/dev/null 2>&1; then
    out=$("$ZAYA" eval --model "$work/model" --tokenizer "$work/tok.json" --task "$work"/synth/eval/*.jsonl --limit 3 \
        2>"$work/err")
    rc=$?
    [ $rc -eq 0 ] && [ "$(echo "$out" | grep -Ec '^[a-z_0-9]+ +(mc|exact) +3 ')" -eq "$(ls "$work"/synth/eval/*.jsonl | wc -l)" ]
    check "synthetic eval tasks" $? "rc=$rc $(tail -2 "$work/err")"
else
    check "synthetic eval tasks" 1 "zaya data synth failed"
fi

# --- held-out loss on a shard split ------------------------------------------------------------------------------
i=0
while IFS= read -r line; do
    [ -n "$line" ] && printf '{"text": "%s %d"}\n' "$line" $((i += 1))
done < <(for k in 1 2 3 4 5 6 7 8; do cat "$work/corpus.txt"; done) >"$work/docs.jsonl"
"$ZAYA" data prepare --tokenizer "$work/tok.json" --input "$work/docs.jsonl" --out "$work/shards" --val-fraction 0.3 \
    >/dev/null 2>&1
check "setup shards" $?
out=$("$ZAYA" eval --model "$work/model" --shards "$work/shards" --seq-len 32 --json "$work/sh.json" 2>"$work/err")
check "eval --shards runs" $? "$(cat "$work/err")"
echo "$out" | sed 's/^/    /'
echo "$out" | grep -Eq '^val +loss +[0-9]+ +- +- +[0-9]+\.[0-9]{4} +\(loss [0-9]+\.[0-9]+\)$'
check "shard row (val)" $?
grep -q '"name":.*"val"' "$work/sh.json" && ! grep -q '"tasks":.*{' "$work/sh.json"
check "shard json" $?
out=$("$ZAYA" eval --model "$work/model" --shards "$work/shards" --split train --max-tokens 50 --seq-len 16 2>/dev/null)
echo "$out" | grep -Eq '^train +loss +50 '
check "--split train --max-tokens" $?

# --- bf16 weights: same evaluation, loss within bf16 rounding of the fp32 loss ------------------------------------
l32=$("$ZAYA" eval --model "$work/model" --tokens "$work/held.npy" --seq-len 32 --json "$work/l32.json" >/dev/null 2>&1 &&
    python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["heldout"]["loss"])' "$work/l32.json")
l16=$("$ZAYA" eval --model "$work/model" --tokens "$work/held.npy" --seq-len 32 --dtype bf16 --json "$work/l16.json" \
    >/dev/null 2>"$work/err" && python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["heldout"]["loss"])' "$work/l16.json")
python3 -c 'import sys; a, b = map(float, sys.argv[1:]); assert a != b and abs(a - b) < 1e-2 * a, (a, b)' "$l32" "$l16" &&
    grep -q "^weights  *bf16" "$work/err" && grep -q '"weights":[[:space:]]*"bf16"' "$work/l16.json"
check "eval --dtype bf16: held-out loss within 1% of fp32 ($l32 vs $l16)" $?
"$ZAYA" generate --model "$work/model" --tokenizer "$work/tok.json" --prompt "The capital of" --max-tokens 12 \
    --seed 1 --dtype bf16 >"$work/gen16.out" 2>"$work/gen16.err" &&
    "$ZAYA" generate --model "$work/model" --tokenizer "$work/tok.json" --prompt "The capital of" --max-tokens 12 \
        --seed 1 --dtype bf16 >"$work/gen16b.out" 2>/dev/null && [ -s "$work/gen16.out" ] &&
    cmp -s "$work/gen16.out" "$work/gen16b.out"
check "generate --dtype bf16: output, deterministic" $? "$(tail -2 "$work/gen16.err")"
out=$("$ZAYA" bench decode --model "$work/model" --context 16 --tokens 8 --dtype bf16 2>&1)
echo "$out" | grep -Eq '^bf16 vs f32 +logits over 24 positions: relative error median [0-9.e+-]+, max [0-9.e+-]+; same top-1 token at [0-9.]+%$' &&
    echo "$out" | grep -Eq '^weights +bf16: [0-9.]+ MB read per decoding step'
check "bench decode --dtype bf16: accuracy vs f32 reported" $? "$out"
# generation_config.json (as releases ship it): its eos ids stop generation, its sampling settings are the defaults
cp -r "$work/model" "$work/model_gc"
first=$("$ZAYA" generate --model "$work/model" --ids --prompt "2 3 4" --max-tokens 1 --temperature 0 2>/dev/null | tr -d ' \n')
echo "{\"eos_token_id\": [$first, 999], \"do_sample\": false}" >"$work/model_gc/generation_config.json"
out=$("$ZAYA" generate --model "$work/model_gc" --ids --prompt "2 3 4" --max-tokens 10 2>"$work/gc.err" | tr -d '\n')
[ "$(echo $out)" = "$first" ] && grep -q "stopped: end of sequence" "$work/gc.err" &&
    grep -q "^sampling  *temperature 0, top-k 50, top-p 1 (flags, then .*generation_config.json)" "$work/gc.err"
check "generation_config.json: its eos id stops generation; do_sample false means greedy" $? "$out / $(cat "$work/gc.err")"
echo '{"eos_token_id": "x"}' >"$work/model_gc/generation_config.json"
"$ZAYA" generate --model "$work/model_gc" --ids --prompt "2 3" >/dev/null 2>"$work/err"
[ $? -eq 1 ] && grep -q 'generation_config.json: eos_token_id must be an integer or a list of integers' "$work/err"
check "generation_config.json: a bad eos_token_id is named" $? "$(cat "$work/err")"
"$ZAYA" generate --model "$work/model" --ids --prompt "2 3" --dtype fp16 >/dev/null 2>"$work/err"
[ $? -eq 1 ] && grep -q 'generate: --dtype: unknown data type "fp16" (f32, bf16, q8, q4 or auto)' "$work/err"
check "generate: bad --dtype named" $? "$(cat "$work/err")"

# --- errors: exit 1, "zaya: <file>:<line>: <reason>" -------------------------------------------------------------
expect_error() { # NAME PATTERN ARGS...
    local name=$1 pattern=$2
    shift 2
    "$ZAYA" eval "$@" >/dev/null 2>"$work/err"
    local rc=$?
    if [ $rc -eq 1 ] && grep -Eq -e "$pattern" "$work/err"; then check "$name" 0; else check "$name" 1 "rc=$rc $(cat "$work/err")"; fi
}
M=(--model "$work/model" --tokenizer "$work/tok.json")
printf '{"context": "a", "choices": ["b"], "answer": 0}\n{"context": "a", "choices": ["b"], "answer": 0\n' >"$work/bad1.jsonl"
expect_error "malformed JSON line" "^zaya: $work/bad1.jsonl:2: invalid JSON at column" "${M[@]}" --task "$work/bad1.jsonl"
printf '{"context": "a", "choices": ["b", "c"], "answer": 0}\n\n{"context": "a", "choices": ["b", "c"], "answer": 2}\n' >"$work/bad2.jsonl"
expect_error "answer out of range" "^zaya: $work/bad2.jsonl:3: \"answer\" must be an integer index" "${M[@]}" --task "$work/bad2.jsonl"
printf '{"question": "a", "label": 1}\n' >"$work/bad3.jsonl"
expect_error "unknown task type" "^zaya: $work/bad3.jsonl:1: unknown task line" "${M[@]}" --task "$work/bad3.jsonl"
printf '{"prompt": "a", "answer": "b"}\n{"prompt": "a"}\n' >"$work/bad4.jsonl"
expect_error "exact-match line without answer" "^zaya: $work/bad4.jsonl:2: an exact-match line needs" "${M[@]}" --task "$work/bad4.jsonl"
expect_error "later task file malformed" "^zaya: $work/bad1.jsonl:2:" "${M[@]}" --task "$work/mc.jsonl" "$work/bad1.jsonl"
expect_error "missing task file" "$work/nope.jsonl" "${M[@]}" --task "$work/nope.jsonl"
expect_error "task without tokenizer" "--task needs --tokenizer" --model "$work/model" --task "$work/mc.jsonl"
expect_error "nothing to evaluate" "nothing to evaluate" --model "$work/model"
expect_error "bad flag" "unknown option" --model "$work/model" --tokens "$work/held.npy" --bogus 1
expect_error "unknown split" "unknown split \"bogus\"" --model "$work/model" --shards "$work/shards" --split bogus
expect_error "unknown device" "eval: --device: unknown device \"tpu\"" --model "$work/model" --tokens "$work/held.npy" --device tpu
# no usable GPU here (CI has none; a CPU-only build says so too): a clear error, nothing evaluated
if ! "$ZAYA" info 2>/dev/null | grep -q '^gpu .*device 0:'; then
    expect_error "--device cuda without a GPU" "--device cuda: (no GPU on this machine|this zaya was built without GPU support)" \
        --model "$work/model" --tokens "$work/held.npy" --device cuda
fi
expect_error "shards and tokens together" "alternatives" --model "$work/model" --shards "$work/shards" --tokens "$work/held.npy"
expect_error "missing shard directory" "$work/none" --model "$work/model" --shards "$work/none"
"$ZAYA" init --config configs/tiny.json --out "$work/small" >/dev/null 2>&1
expect_error "shards with a larger vocabulary than the model" "vocabulary \(300\) is larger than the model's \(128\)" \
    --model "$work/small" --shards "$work/shards"
expect_error "tokenizer larger than the model" "more than the model's vocabulary" --model "$work/small" \
    --tokenizer "$work/tok.json" --task "$work/mc.jsonl"
expect_error "window longer than the model" "max_position_embeddings" --model "$work/model" --tokens "$work/held.npy" --seq-len 100000
expect_error "unknown --dtype" 'eval: --dtype: unknown data type "f16"' --model "$work/model" --tokens "$work/held.npy" --dtype f16

# --- generate in text mode (needs the same tokenizer) -----------------------------------------------------------
"$ZAYA" generate --model "$work/model" --tokenizer "$work/tok.json" --prompt "The capital of" --max-tokens 12 \
    --seed 1 >"$work/gen.out" 2>"$work/gen.err"
rc=$?
grep -q "^prompt tokens" "$work/gen.err" && grep -q "^decode .* tokens/s" "$work/gen.err" &&
    grep -Eq "^KV cache +256 bytes per token" "$work/gen.err" && [ -s "$work/gen.out" ]
check "generate text: output and stats" $((rc + $?)) "$(cat "$work/gen.err")"
"$ZAYA" generate --model "$work/model" --tokenizer "$work/tok.json" --prompt "The capital of" --max-tokens 12 \
    --seed 1 >"$work/gen2.out" 2>/dev/null
cmp -s "$work/gen.out" "$work/gen2.out"
check "generate text: deterministic for a seed" $?
"$ZAYA" generate --model "$work/model" --prompt "x" >/dev/null 2>"$work/err"
[ $? -eq 1 ] && grep -q "give --tokenizer" "$work/err"
check "generate without tokenizer or --ids" $?
finish
