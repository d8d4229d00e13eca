#!/usr/bin/env bash
# zaya with `--device cuda` added to `forward`: points the transformers oracle (tests/oracle/test_oracle.py, via
# ZAYA_BIN) at the GPU model, so its logits, loss, every gradient and the routing are checked against
# ZayaForCausalLM exactly as the CPU's are.
z="$(cd "$(dirname "$0")/../.." && pwd)/build/zaya"
if [ "${1:-}" = forward ]; then exec "$z" "$@" --device cuda; else exec "$z" "$@"; fi
