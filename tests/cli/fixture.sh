# Shared set-up for the CLI and chaos test scripts; sourced, never run as a suite (tests/run_all.sh runs only
# tests/cli/test_*.sh). Source it with a path relative to the sourcing script, e.g.
#   . "$(dirname "${BASH_SOURCE[0]}")/fixture.sh"
# The functions call the binary named by the caller's $ZAYA.
#
#   suite_begin NAME                   pass/fail counters and ok / bad / check / finish ("NAME: N passed, N failed")
#   fixture_mpi_env                    the environment for single-machine Open MPI runs as root, one OpenMP thread
#   fixture_corpus DIR                 the synthetic corpus (seed 3, scale 0.05) in DIR/corpus
#   fixture_general_data DIR VOCAB     corpus, a VOCAB-token tokenizer DIR/tok.json trained on general.jsonl, and
#                                      its shards in DIR/data
#   fixture_all_data DIR VOCAB         corpus, a VOCAB-token tokenizer DIR/tok.json trained on all three datasets,
#                                      and shards in DIR/data/{general,mathcode,longctx}
#   fixture_model_json FILE VOCAB MAXPOS   the tiny 2-layer model config (hidden 32, 4 experts)
#
# The data functions return non-zero on the first failing step and leave its name in $fixture_error.

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    echo "fixture.sh is meant to be sourced by a test script, not run" >&2
    exit 2
fi

suite_begin() { # NAME
    suite_name=$1
    pass=0
    fail=0
}
ok() { echo "ok   $*"; pass=$((pass + 1)); }
bad() { echo "FAIL $*"; fail=$((fail + 1)); }
check() { local name=$1; shift; if "$@"; then ok "$name"; else bad "$name"; fi; }
finish() { echo "$suite_name: $pass passed, $fail failed"; [ "$fail" -eq 0 ]; exit $?; }

fixture_mpi_env() {
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader OMP_NUM_THREADS=1
}

fixture_corpus() { # DIR
    fixture_error="data synth"
    $ZAYA data synth --out "$1/corpus" --seed 3 --scale 0.05 >/dev/null
}

fixture_general_data() { # DIR VOCAB
    local w=$1 vocab=$2
    fixture_corpus "$w" || return 1
    fixture_error="tokenizer train"
    $ZAYA tokenizer train --input "$w/corpus/general.jsonl" --vocab-size "$vocab" --out "$w/tok.json" >/dev/null ||
        return 1
    fixture_error="data prepare general"
    $ZAYA data prepare --tokenizer "$w/tok.json" --input "$w/corpus/general.jsonl" --out "$w/data" --val-fraction 0.05 \
        >/dev/null 2>&1
}

fixture_all_data() { # DIR VOCAB
    local w=$1 vocab=$2 d
    fixture_corpus "$w" || return 1
    fixture_error="tokenizer train"
    $ZAYA tokenizer train --input "$w/corpus/general.jsonl" "$w/corpus/mathcode.jsonl" "$w/corpus/longctx.jsonl" \
        --vocab-size "$vocab" --out "$w/tok.json" >/dev/null || return 1
    for d in general mathcode longctx; do
        fixture_error="data prepare $d"
        $ZAYA data prepare --tokenizer "$w/tok.json" --input "$w/corpus/$d.jsonl" --out "$w/data/$d" \
            --val-fraction 0.05 >/dev/null 2>&1 || return 1
    done
}

fixture_model_json() { # FILE VOCAB MAXPOS
    cat >"$1" <<JSON
{"model_type": "zaya", "vocab_size": $2, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
 "num_key_value_heads": 2, "head_dim": 8, "moe_intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 1,
 "router_hidden_size": 16, "cca_time0": 2, "cca_time1": 2, "rms_norm_eps": 1e-5, "tie_word_embeddings": true,
 "max_position_embeddings": $3, "rope_parameters": {"hybrid": {"rope_type": "default", "rope_theta": 10000.0,
 "partial_rotary_factor": 0.5}}, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
JSON
}
