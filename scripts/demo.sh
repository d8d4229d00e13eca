#!/usr/bin/env bash
# The main job, for now: initialise a tiny ZAYA model and run a forward + backward pass on random tokens.
# (The training issue replaces this with the full synthetic-curriculum training run.)
set -euo pipefail
cd "$(dirname "$0")/.."
out=runs/demo
rm -rf "$out"
mkdir -p "$out"
build/zaya init --config configs/tiny.json --out "$out/model" --seed 0
python3 -c "import numpy as np; np.save('$out/tokens.npy', np.random.default_rng(0).integers(0, 128, size=(4, 64), dtype=np.int64))"
build/zaya forward --model "$out/model" --tokens "$out/tokens.npy" --logits-out "$out/logits.npy" --grads-out "$out/grads.safetensors"
echo "demo: model in $out/model (loadable with transformers.ZayaForCausalLM.from_pretrained), logits and gradients in $out/"
