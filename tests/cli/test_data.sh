#!/usr/bin/env bash
# CLI tests of `zaya data`: synth (determinism, held-out additions absent from training text), then with a small
# trained tokenizer: prepare (splits, shards, determinism, .txt separators), info --verify, and the error paths
# (malformed line reported as file:line, --strict, an existing directory refused, a corrupt shard detected).
# Ends with one line "data: N passed, N failed"; exits non-zero on any failure.
set -uo pipefail
cd "$(dirname "$0")/../.."
Z=${ZAYA_BIN:-build/zaya} # ZAYA_BIN=build-asan/zaya runs the same checks under ASan + UBSan
T=$(mktemp -d /tmp/zy_data_XXXXXX)
trap 'rm -rf "$T"' EXIT
pass=0
fail=0

ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() {
    fail=$((fail + 1))
    echo "FAIL $1"
    [ -f "$T/log" ] && sed 's/^/    /' "$T/log" | tail -n 8
}
# run NAME CMD...: expects exit status 0
run() {
    local name=$1
    shift
    if "$@" >"$T/log" 2>&1; then ok "$name"; else bad "$name"; fi
}
# run_fail NAME NEEDLE CMD...: expects a non-zero exit status and NEEDLE in the output
run_fail() {
    local name=$1 needle=$2
    shift 2
    "$@" >"$T/log" 2>&1
    local rc=$?
    if [ "$rc" -ne 0 ] && grep -qF -- "$needle" "$T/log"; then ok "$name"; else bad "$name (exit $rc, want \"$needle\")"; fi
}
# expect NAME CONDITION-CMD...: a plain check
expect() {
    local name=$1
    shift
    if "$@"; then ok "$name"; else bad "$name"; fi
}

if [ ! -x "$Z" ]; then
    echo "FAIL $Z is missing (run make)"
    echo "data: 0 passed, 1 failed"
    exit 1
fi

# ---- synth
S="$T/synth"
run "synth writes the corpus" "$Z" data synth --out "$S" --seed 3 --scale 0.1
expect "synth prints counts per file" grep -q "mathcode.jsonl .* records" "$T/log"
for f in general.jsonl mathcode.jsonl longctx.jsonl README.txt eval/addition2.jsonl eval/arith_mc.jsonl \
    eval/kv_recall.jsonl eval/general_mc.jsonl eval/code_exec.jsonl; do
    expect "synth wrote $f" test -s "$S/$f"
done
run "synth again with the same seed" "$Z" data synth --out "$T/synth2" --seed 3 --scale 0.1
expect "synth is deterministic" diff -r "$S" "$T/synth2"
run "synth with another seed" "$Z" data synth --out "$T/synth3" --seed 4 --scale 0.1
expect "another seed gives other data" bash -c "! cmp -s '$S/general.jsonl' '$T/synth3/general.jsonl'"
run_fail "synth rejects a bad scale" "scale" "$Z" data synth --out "$T/x" --scale 0
# every held-out "a+b=" (and "b+a=", and spaced) absent from the training text, with digit boundaries
sed -E 's/.*"prompt": "([0-9]+)\+([0-9]+)=".*/(^|[^0-9])(\1 ?\\+ ?\2|\2 ?\\+ ?\1)([^0-9]|$)/' "$S/eval/addition2.jsonl" >"$T/held.re"
expect "held-out patterns extracted" test "$(wc -l <"$T/held.re")" -gt 700
expect "held-out additions absent from training text" \
    bash -c "! grep -qE -f '$T/held.re' '$S/general.jsonl' '$S/mathcode.jsonl' '$S/longctx.jsonl'"
expect "2-digit additions present in training text" \
    bash -c "[ \$(grep -oE '[^0-9][1-9][0-9]\\+[1-9][0-9]=[0-9]+' '$S/mathcode.jsonl' | wc -l) -gt 5000 ]"

# ---- tokenizer + prepare
TRAIN=("$S/general.jsonl" "$S/mathcode.jsonl" "$S/longctx.jsonl")
if [ -f src/tokenizer/tokenizer.h ] && "$Z" tokenizer train --input "${TRAIN[@]}" --vocab-size 600 --out "$T/tok.json" >"$T/log" 2>&1; then
    ok "tokenizer trained"
    D="$T/shards"
    run "prepare" "$Z" data prepare --tokenizer "$T/tok.json" --input "${TRAIN[@]}" --out "$D" --val-fraction 0.1 --seed 1
    expect "prepare prints MB/s per split" bash -c "grep -q '^train .*MB/s' '$T/log' && grep -q '^val .*MB/s' '$T/log'"
    expect "prepare wrote meta.json and shards" test -s "$D/meta.json" -a -s "$D/train-00000.bin" -a -s "$D/val-00000.bin"
    expect "no temporary directory left" bash -c "! ls -d '$T'/shards.tmp-* 2>/dev/null | grep -q ."
    train_tokens=$(awk '$1 == "train" {print $4}' "$T/log")
    run "info --verify" "$Z" data info --dir "$D" --verify
    expect "info agrees with prepare" bash -c "awk '\$1 == \"train\" {print \$2}' '$T/log' | grep -qx '$train_tokens'"
    run "prepare again, same seed" "$Z" data prepare --tokenizer "$T/tok.json" --input "${TRAIN[@]}" --out "$T/shards2" \
        --val-fraction 0.1 --seed 1 --threads 1
    expect "prepare is deterministic (any thread count)" diff -r "$D" "$T/shards2"
    run "prepare into small shards" "$Z" data prepare --tokenizer "$T/tok.json" --input "$S/mathcode.jsonl" \
        --out "$T/small" --shard-tokens 50000
    expect "several shards written" test -s "$T/small/train-00002.bin"
    run "info --verify on several shards" "$Z" data info --dir "$T/small" --verify

    # malformed lines: reported with file:line and skipped; --strict fails and writes nothing
    B="$T/bad.jsonl"
    printf '%s\n' '{"text": "good one"}' '{"text": "broken' '{"title": "no text"}' '{"text": 42}' '{"text": "good two"}' >"$B"
    run "prepare skips malformed lines" "$Z" data prepare --tokenizer "$T/tok.json" --input "$B" --out "$T/b1"
    expect "malformed line reported as file:line" grep -qF "$B:2: invalid JSON" "$T/log"
    expect "missing text reported" grep -qF "$B:3: missing \"text\"" "$T/log"
    expect "non-string text reported" grep -qF "$B:4: \"text\" is not a string" "$T/log"
    expect "skipped lines counted" grep -q "skipped 3 malformed lines" "$T/log"
    expect "two documents kept" grep -qE '^total +2 documents' "$T/log"
    tokens_plain=$(awk '$1 == "total" {print $4}' "$T/log")
    run "prepare --bos" "$Z" data prepare --tokenizer "$T/tok.json" --input "$B" --out "$T/b1bos" --bos
    expect "--bos adds one token per document" test "$(awk '$1 == "total" {print $4}' "$T/log")" = "$((tokens_plain + 2))"
    # BOS / EOS by name, as transformers: a model folder whose tokens are Gemma 3's <bos> / <eos>, named by
    # tokenizer_config.json (the same ids, so the same shards as <|bos|> / <|eos|>); else the usual names; else an error
    G="$T/gemma"
    mkdir -p "$G"
    sed -e 's/<|bos|>/<bos>/g' -e 's/<|eos|>/<eos>/g' "$T/tok.json" >"$G/tokenizer.json"
    printf '{"bos_token": "<bos>", "eos_token": {"content": "<eos>", "special": true}}\n' >"$G/tokenizer_config.json"
    run "prepare --bos with a model folder (tokenizer_config.json names <bos>/<eos>)" \
        "$Z" data prepare --tokenizer "$G" --input "$B" --out "$T/g1" --bos
    expect "same shard as with <|bos|>/<|eos|>" cmp -s "$T/g1/train-00000.bin" "$T/b1bos/train-00000.bin"
    printf '{"bos_token": "<eos>", "eos_token": "<bos>"}\n' >"$G/tokenizer_config.json"
    run "prepare --bos, names swapped in tokenizer_config.json" \
        "$Z" data prepare --tokenizer "$G/tokenizer.json" --input "$B" --out "$T/g2" --bos
    expect "the configured names win (the shard differs)" bash -c "! cmp -s '$T/g2/train-00000.bin' '$T/b1bos/train-00000.bin'"
    rm "$G/tokenizer_config.json"
    run "prepare --bos without tokenizer_config.json: the special tokens <bos>/<eos>" \
        "$Z" data prepare --tokenizer "$G" --input "$B" --out "$T/g3" --bos
    expect "same shard again" cmp -s "$T/g3/train-00000.bin" "$T/b1bos/train-00000.bin"
    printf '{"eos_token": "<end_of_turn>"}\n' >"$G/tokenizer_config.json"
    run_fail "an eos_token not in the vocabulary is named" 'tokenizer_config.json: eos_token "<end_of_turn>" is not in the vocabulary' \
        "$Z" data prepare --tokenizer "$G" --input "$B" --out "$T/g4"
    rm "$G/tokenizer_config.json"
    sed -i -e 's/<bos>/<start>/g' -e 's/<eos>/<stop>/g' "$G/tokenizer.json"
    run_fail "no end-of-sequence token: a clear error" "no end-of-sequence token" \
        "$Z" data prepare --tokenizer "$G" --input "$B" --out "$T/g5"
    run "without --bos no beginning-of-sequence token is needed" bash -c \
        "sed 's/<stop>/<\/s>/g' '$G/tokenizer.json' >'$T/s.json' && '$Z' data prepare --tokenizer '$T/s.json' --input '$B' --out '$T/g6'"
    expect "</s> found as the end-of-sequence token" cmp -s "$T/g6/train-00000.bin" "$T/b1/train-00000.bin"
    run_fail "--bos without one: a clear error" "--bos: no beginning-of-sequence token" \
        "$Z" data prepare --tokenizer "$T/s.json" --input "$B" --out "$T/g7" --bos
    run_fail "--strict fails on a malformed line" "$B:2: invalid JSON" \
        "$Z" data prepare --tokenizer "$T/tok.json" --input "$B" --out "$T/b2" --strict
    expect "--strict leaves no output directory" test ! -e "$T/b2"

    # an existing non-empty directory is refused unless --force
    run_fail "existing directory refused" "not empty" \
        "$Z" data prepare --tokenizer "$T/tok.json" --input "$S/general.jsonl" --out "$D"
    expect "refused run left the shards intact" cmp -s "$D/meta.json" "$T/shards2/meta.json"
    run "--force replaces the shards" "$Z" data prepare --tokenizer "$T/tok.json" --input "$B" --out "$D" --force
    run "info after --force" "$Z" data info --dir "$D"

    # .txt documents separated by <|endoftext|>
    printf 'first doc\n<|endoftext|>\nsecond doc\nline two\n<|endoftext|>\nthird\n' >"$T/docs.txt"
    run "prepare .txt with separators" "$Z" data prepare --tokenizer "$T/tok.json" --input "$T/docs.txt" --out "$T/t1" \
        --val-fraction 0
    expect "three .txt documents" grep -qE '^total +3 documents' "$T/log"

    # corruption is detected by info --verify, naming the file
    cp -r "$T/shards2" "$T/corrupt"
    printf '\x01' | dd of="$T/corrupt/train-00000.bin" bs=1 seek=100 conv=notrunc status=none
    run_fail "corrupt payload detected" "train-00000.bin: payload CRC mismatch" "$Z" data info --dir "$T/corrupt" --verify
    rm "$T/corrupt/val-00000.bin"
    run_fail "missing shard detected" "val-00000.bin: cannot open shard" "$Z" data info --dir "$T/corrupt"
    run_fail "prepare needs a tokenizer file" "nope.json" \
        "$Z" data prepare --tokenizer "$T/nope.json" --input "$B" --out "$T/b3"
    run_fail "prepare rejects other file types" "unsupported input" \
        "$Z" data prepare --tokenizer "$T/tok.json" --input "$T/tok.json" --out "$T/b4"
else
    echo "skip prepare tests: no working 'zaya tokenizer train'"
fi

run_fail "unknown data subcommand" "unknown subcommand" "$Z" data frobnicate
run_fail "unknown option" "unknown option" "$Z" data synth --out "$T/y" --bogus 1

echo "data: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
