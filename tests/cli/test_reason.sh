#!/usr/bin/env bash
# CLI test of `zaya reason` (Markovian RSA, src/serve/reason.c) on a tiny model with a tokenizer trained here: the
# per-round report on stderr; --json's rounds, where every trace of round t > 1 has K distinct sources in the last
# round and its aggregation prompt holds, in order, exactly the decoded last tau tokens of each (NUL bytes dropped;
# zaya tokenizer decode of tail_ids, which are the trace's last tau ids); the default template and a --template;
# --messages; the vote's report against the traces' answers; the same seed giving the same traces; bad flags.
# Ends with "reason: N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/../.."
ZAYA=${ZAYA_BIN:-build/zaya}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
. tests/cli/fixture.sh
suite_begin reason
if [ ! -x "$ZAYA" ]; then
    bad "setup: $ZAYA not built (run make)"
    finish
fi
work=$(mktemp -d /tmp/zaya-reason-cli.XXXXXX)
trap 'rm -rf "$work"' EXIT

# --- setup: a tokenizer, its chat template, a tiny model ----------------------------------------------------------
for i in 1 2 3 4 5 6; do
    cat <<'EOF'
What is 12 + 34? The answer is 46. Answer: 46. So the result is \boxed{46}.
Two plus two is four. A candidate solution: check each step, keep what is right, fix what is wrong.
EOF
done >"$work/corpus.txt"
mkdir -p "$work/tok"
"$ZAYA" tokenizer train --input "$work/corpus.txt" --vocab-size 300 --out "$work/tok/tokenizer.json" >/dev/null 2>&1
check "setup tokenizer" test -s "$work/tok/tokenizer.json"
cat >"$work/tok/tokenizer_config.json" <<'EOF'
{"bos_token": "<|bos|>", "eos_token": "<|eos|>",
 "chat_template": "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}{{ '<|assistant|>' }}"}
EOF
sed -e 's/"vocab_size": *[0-9]*/"vocab_size": 320/' -e 's/"bos_token_id": *[0-9]*/"bos_token_id": 1/' \
    -e 's/"eos_token_id": *[0-9]*/"eos_token_id": 2/' \
    -e 's/"max_position_embeddings": *[0-9]*/"max_position_embeddings": 1024/' configs/tiny.json >"$work/cfg.json"
"$ZAYA" init --config "$work/cfg.json" --out "$work/model" --seed 3 >/dev/null 2>&1
check "setup model" test -s "$work/model/config.json"
T="--tokenizer $work/tok/tokenizer.json"

# --- the report ---------------------------------------------------------------------------------------------------
"$ZAYA" reason --model "$work/model" $T --prompt "What is 12 + 34?" --population 4 --subset 2 --rounds 3 --tail 6 \
    --max-tokens 12 --seed 1 >"$work/text.out" 2>"$work/text.err"
check "reason runs" test $? -eq 0
sed 's/^/    /' "$work/text.err"
line='^round [1-3]: 4 traces, [0-9]+ tokens generated, [0-9]+ prompt tokens, prefix-cache hits [0-9]+, '
line+='[0-9.]+ s \([0-9.]+ tokens/s\)$'
check "a report line per round" test "$(grep -Ec "$line" "$work/text.err")" -eq 3
check "an answer line" grep -Eq '^answer: .* \([0-4] of 4 votes; trace [1-4] of the last round\)$' "$work/text.err"
check "the chosen trace on stdout" test -s "$work/text.out"

# --- --json: K tails of at most tau tokens in every later prompt ------------------------------------------------------
run_json() { # OUT EXTRA...
    local out=$1
    shift
    "$ZAYA" reason --model "$work/model" $T --population 4 --subset 3 --rounds 3 --tail 5 --max-tokens 10 --seed 7 \
        --json "$@" >"$out" 2>"$work/json.err"
}
run_json "$work/a.json" --prompt "What is 12 + 34?"
check "--json runs" test $? -eq 0
# every tail, decoded by zaya tokenizer decode (one JSON string per line)
python3 - "$work/a.json" >"$work/tails.jsonl" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
for rd in r["round_reports"]:
    for t in rd["traces"]:
        print(json.dumps(t["tail_ids"]))
EOF
"$ZAYA" tokenizer decode --tokenizer "$work/tok/tokenizer.json" --lossy --jsonl "$work/tails.jsonl" >"$work/tails.txt"
check "tails decoded" test $? -eq 0
check_rounds() { # JSON PROMPT-PATTERN (python format string over the tails: the default or the custom template)
    python3 - "$1" "$work/tails.txt" "$2" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
tails = [json.loads(line) for line in open(sys.argv[2])]
kind = sys.argv[3]
N, K, T, tau = r["population"], r["subset"], r["rounds"], r["tail"]
rounds = r["round_reports"]
assert len(rounds) == T, len(rounds)
k = 0
for t, rd in enumerate(rounds):
    assert rd["round"] == t + 1 and len(rd["traces"]) == N
    gen = sum(len(x["ids"]) for x in rd["traces"])
    assert gen <= rd["tokens_generated"] <= gen + N, (gen, rd["tokens_generated"])  # + an eos per trace at most
    assert rd["prompt_tokens"] == sum(x["prompt_tokens"] for x in rd["traces"])
    assert rd["prefix_cache_hits"] is not None and rd["prefix_cache_hits"] >= 0
    for x in rd["traces"]:
        assert x["tail_ids"] == x["ids"][-tau:] and len(x["tail_ids"]) <= tau, x
        x["tail"] = tails[k].replace("\x00", "")  # NUL bytes are dropped from the tails
        k += 1
    for x in rd["traces"]:
        if t == 0:
            assert "sources" not in x and "prompt" not in x
            continue
        src = x["sources"]
        assert len(src) == K and len(set(src)) == K and all(0 <= s < N for s in src), src
        cands = [rounds[t - 1]["traces"][s]["tail"] for s in src]
        if kind == "default":
            want = "".join(f"--- Candidate {i + 1} ---\n{c}\n" for i, c in enumerate(cands))
            assert x["prompt"].startswith("What is 12 + 34?\n\n"), x["prompt"][:80]
            assert want in x["prompt"] and f"Candidate {K + 1} " not in x["prompt"], (want, x["prompt"])
        else:
            assert x["prompt"] == "P=What is 12 + 34?|R%d|" % (t + 1) + "".join(f"<{c}>" for c in cands), x["prompt"]
last = [x["answer"] for x in rounds[-1]["traces"]]
if any(a is not None for a in last):
    assert r["answer"] is not None and r["votes"] == last.count(r["answer"]) and last[r["chosen"]] == r["answer"]
    assert all(last.count(a) <= r["votes"] for a in last if a is not None)
else:
    assert r["answer"] is None and r["votes"] == 0 and r["chosen"] == 0
assert r["text"] == rounds[-1]["traces"][r["chosen"]]["text"]
EOF
}
check_rounds "$work/a.json" default
check "round t>1 prompts: K sampled tails of <= tau tokens in the default template" test $? -eq 0
run_json "$work/b.json" --prompt "What is 12 + 34?"
python3 - "$work/a.json" "$work/b.json" <<'EOF'
import json, sys
ids = lambda p: [[t["ids"] for t in r["traces"]] for r in json.load(open(p))["round_reports"]]  # noqa: E731
sys.exit(ids(sys.argv[1]) != ids(sys.argv[2]))
EOF
check "the same seed gives the same traces" test $? -eq 0

printf '%s' 'P={{ problem }}|R{{ round }}|{% for c in candidates %}<{{ c }}>{% endfor %}' >"$work/own.jinja"
run_json "$work/c.json" --prompt "What is 12 + 34?" --template "$work/own.jinja"
python3 - "$work/c.json" >"$work/tails.jsonl" <<'EOF'
import json, sys
for rd in json.load(open(sys.argv[1]))["round_reports"]:
    for t in rd["traces"]:
        print(json.dumps(t["tail_ids"]))
EOF
"$ZAYA" tokenizer decode --tokenizer "$work/tok/tokenizer.json" --lossy --jsonl "$work/tails.jsonl" >"$work/tails.txt"
check_rounds "$work/c.json" custom
check "--template: the prompts are that template's" test $? -eq 0

echo '[{"role": "system", "content": "be brief"}, {"role": "user", "content": "What is 12 + 34?"}]' >"$work/msgs.json"
run_json "$work/d.json" --messages "$work/msgs.json"
check "--messages runs" test $? -eq 0
python3 -c "
import json,sys
r=json.load(open('$work/d.json'))['round_reports']
# the chat template wraps the problem: more prompt tokens than the raw text's, and later prompts hold the problem
ok = r[0]['prompt_tokens'] > 0 and all(t['prompt'].startswith('What is 12 + 34?') for t in r[1]['traces'])
sys.exit(0 if ok else 1)"
check "--messages: the last user message is the problem" test $? -eq 0

# --- bad flags ----------------------------------------------------------------------------------------------------
expect_error() { # NAME PATTERN ARGS...
    local name=$1 pat=$2
    shift 2
    "$ZAYA" reason --model "$work/model" $T "$@" >/dev/null 2>"$work/bad.err"
    local rc=$?
    if [ $rc -ne 0 ] && grep -q -- "$pat" "$work/bad.err"; then
        ok "$name"
    else
        bad "$name: rc $rc, $(cat "$work/bad.err")"
    fi
}
expect_error "--subset above --population" "'--subset' must be an integer from 1 to 4" --prompt x --population 4 \
    --subset 5
expect_error "--rounds 0" "'--rounds'" --prompt x --rounds 0
expect_error "--tail 0" "'--tail'" --prompt x --tail 0
expect_error "--population 0" "'--population'" --prompt x --population 0
expect_error "--prompt and --messages" "exactly one of --prompt and --messages" --prompt x --messages "$work/msgs.json"
printf '%s' '{% for c in candidates %}' >"$work/broken.jinja"
expect_error "a broken --template" "--template" --prompt x --template "$work/broken.jinja"
echo '[{"role": "system", "content": "no user"}]' >"$work/nouser.json"
expect_error "--messages without a user message" "needs a user message" --messages "$work/nouser.json"
finish
