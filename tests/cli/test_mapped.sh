#!/usr/bin/env bash
# CLI test of the large-model inference path on a mid-size model (46 M parameters): `zaya init --dtype bf16` streams
# sharded bf16 safetensors with an index; generate/bench decode run it from the mapped shards (`--dtype auto` picks
# bf16 for a bf16 model) with a peak resident memory well below the fp32 load's, report the bytes read per token,
# the measured bandwidth and the bound it implies; the released ZAYA1-8B config parses and would stream.
# Ends with "mapped: N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/../.."
ZAYA=${ZAYA_BIN:-build/zaya}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
. tests/cli/fixture.sh
suite_begin mapped
if [ ! -x "$ZAYA" ]; then
    bad "setup: $ZAYA not built (run make)"
    finish
fi
work=$(mktemp -d /tmp/zaya-mapped-cli.XXXXXX)
trap 'rm -rf "$work"' EXIT

cat >"$work/mid.json" <<'EOF'
{"model_type": "zaya", "vocab_size": 32000, "hidden_size": 512, "num_hidden_layers": 4, "num_attention_heads": 4,
 "num_key_value_heads": 2, "head_dim": 64, "moe_intermediate_size": 512, "num_experts": 8, "num_experts_per_tok": 1,
 "router_hidden_size": 64, "cca_time0": 2, "cca_time1": 2, "rms_norm_eps": 1e-5, "tie_word_embeddings": true,
 "max_position_embeddings": 512, "rope_theta": 10000.0, "initializer_range": 0.02, "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0}
EOF
# --- streamed init: shards + index, half the bytes of f32 ---------------------------------------------------------
out=$("$ZAYA" init --config "$work/mid.json" --out "$work/m16" --dtype bf16 --seed 4 --shard-size 30 2>&1)
check "init --dtype bf16 --shard-size 30: three shards and an index" \
    bash -c '[ -f "$1/model.safetensors.index.json" ] && [ -f "$1/model-00003-of-00003.safetensors" ] &&
             [ ! -f "$1/model.safetensors" ] && echo "$2" | grep -q "bf16, 3 shards"' _ "$work/m16" "$out"
"$ZAYA" init --config "$work/mid.json" --out "$work/m32" --seed 4 >/dev/null 2>&1
b16=$(cat "$work"/m16/*.safetensors | wc -c)
b32=$(wc -c <"$work/m32/model.safetensors")
check "bf16 files are half the f32 file ($b16 vs $b32 bytes)" \
    python3 -c "import sys; a, b = int(sys.argv[1]), int(sys.argv[2]); sys.exit(not 0.49 < a / b < 0.51)" "$b16" "$b32"

# --- generate: auto = bf16 from the mapped shards, lower peak than the f32 load ------------------------------------
gen() { "$ZAYA" generate --model "$1" --ids --prompt "2 17 5 9" --max-tokens 6 --temperature 0 --dtype "$2" 2>&1; }
o16=$(gen "$work/m16" auto)
o32=$(gen "$work/m16" f32)
peak() { echo "$1" | sed -nE 's/^peak memory +([0-9.]+) GB resident.*/\1/p'; }
p16=$(peak "$o16")
p32=$(peak "$o32")
check "generate --dtype auto on a bf16 model: bf16 from the mapped files" \
    bash -c 'echo "$1" | grep -Eq "^weights +bf16 .*: [1-9][0-9.]* MB used in place from the mapped files"' _ "$o16"
check "generate reports its peak memory (bf16 $p16 GB, f32 $p32 GB)" test -n "$p16" -a -n "$p32"
# f32 holds 183 MB of weights resident, bf16 at most the 92 MB of mapped pages: expect at least 60 MB less
check "bf16 peak below the f32 peak by most of the fp32/bf16 difference" \
    python3 -c "import sys; sys.exit(not float(sys.argv[2]) - float(sys.argv[1]) > 0.06)" "${p16:-9}" "${p32:-0}"
check "f32 and bf16 greedy outputs are ids in range" \
    bash -c 'echo "$1" | grep -Eq "^[0-9]+( [0-9]+){5}$" && echo "$2" | grep -Eq "^[0-9]+( [0-9]+){5}$"' _ "$o16" "$o32"

# --- bench decode: bytes per token, bandwidth, bound, peak ---------------------------------------------------------
out=$("$ZAYA" bench decode --model "$work/m16" --context 16 --tokens 8 2>&1)
check "bench decode: bytes per step, measured bandwidth and the bound" \
    bash -c 'echo "$1" | grep -Eq "^weights +bf16: [0-9.]+ MB read per decoding step" &&
             echo "$1" | grep -Eq "^bandwidth +[0-9.]+ GB/s memory read, measured .* decoding at most [0-9.]+ tokens/s" &&
             echo "$1" | grep -Eq "^peak memory +[0-9.]+ GB resident" &&
             echo "$1" | grep -Eq "^host +the threads. clock [0-9.]+ GHz \(median of [0-9]+ chains" &&
             echo "$1" | grep -Eq "^bf16 vs f32 +logits over 24 positions"' _ "$out"
check "bench decode json line" \
    bash -c 'echo "$1" | sed -n "s/^json *//p" | python3 -c "import json,sys; d=json.load(sys.stdin); sys.exit(not (d[\"dtype\"]==\"bf16\" and d[\"bytes_per_step\"]>0 and d[\"bandwidth_bytes_per_s\"]>1e8 and d[\"peak_rss_bytes\"]>0 and 0.3<d[\"clock_ghz\"]<10 and (d[\"steal_share\"]==-1 or 0<=d[\"steal_share\"]<=1)))"' _ "$out"

# --- the released 8B config: parses (stray rope_type, layer_types), its size is what the release says -------------
out=$("$ZAYA" init --config configs/zaya1-8b.json --out "$work/none" --dtype bf16 --shard-size 0 2>&1)
check "zaya1-8b.json parses (init refuses only the shard size)" \
    bash -c 'echo "$1" | grep -q "shard-size must be a positive number"' _ "$out"

# --- errors ------------------------------------------------------------------------------------------------------
rm -f "$work/m16/model-00002-of-00003.safetensors"
out=$(gen "$work/m16" bf16)
check "a missing shard is named" \
    bash -c 'echo "$1" | grep -q "names shard \"model-00002-of-00003.safetensors\", which does not exist"' _ "$out"
out=$("$ZAYA" init --config "$work/mid.json" --out "$work/x" --dtype fp16 2>&1)
check "init --dtype fp16 is refused" bash -c 'echo "$1" | grep -q "init: --dtype: unknown data type \"fp16\""' _ "$out"
finish
