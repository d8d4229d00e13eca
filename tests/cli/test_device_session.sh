#!/usr/bin/env bash
# tests/gpu/device-session.sh in its dry run (ZAYA_DEVICE_DRY=1: CPU binaries, a tiny model, no GPU), so the lent-GPU
# script cannot rot unseen: every part runs its plumbing, everything comes back as one archive plus summary.txt (the
# device returns at most 8 files), the profile divides by the steps the binary says it ran and holds no probe GEMM, the
# train part runs bench train with --micro-batches and hands the PyTorch comparison the same accumulation.
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/fixture.sh"
cd "$(dirname "$0")/../.."
W=$(mktemp -d /tmp/zaya_device_session_test.XXXXXX)
trap 'rm -rf "$W"' EXIT
suite_begin device-session

OUT="$W/out" ZAYA_DEVICE_DRY=1 tests/gpu/device-session.sh 300 tests,bench,gemm,experts,attention,conv,window,muon,graphs,train,compile,pair,slice,decode,decode8b,serve,profile >"$W/run.txt" 2>&1
rc=$?
[ "$rc" -eq 0 ] && ok "dry run of every part exits 0" || bad "dry run exit $rc: $(tail -n 20 "$W/run.txt")"

returned=$(cd "$W/out" 2>/dev/null && ls | tr '\n' ' ')
[ "$returned" = "gpu-session.tar.gz summary.txt " ] && ok "\$OUT holds one archive and summary.txt" ||
    bad "\$OUT holds: $returned"
mkdir -p "$W/x" && tar -xzf "$W/out/gpu-session.tar.gz" -C "$W/x" 2>/dev/null
missing=""
for f in summary.txt test-gpu.log bench-gemm.txt vs-pytorch.txt experts-async-1.txt experts-sm90-1.txt \
    experts-async-2.txt experts-sm90-2.txt attention-own-1.txt attention-cudnn-1.txt attention-own-2.txt \
    attention-cudnn-2.txt attention-fp32-1.txt attention-tc-2.txt optimizer-off-1.txt optimizer-on-2.txt train-8b-slice.txt vs-pytorch-8b-slice.txt compile.txt profile-cut.json ncu.csv ncu-run.txt kernel-times.txt \
    pair-zaya.txt pair-compile.txt slice-adamw.txt slice-muon.txt decode-b1-f32.txt decode-b1-bf16.txt decode-b32-f32.txt \
    decode-b32-bf16.txt decode-8b.txt serve.txt; do
    [ -s "$W/x/$f" ] || missing="$missing $f"
done
[ -z "$missing" ] && ok "the archive holds every part's log" || bad "the archive lacks:$missing"
grep -q 'gpu-session.tar.gz' "$W/run.txt" && grep -q '  kernel-times.txt' "$W/run.txt" &&
    ok "the run lists the archive it returns" || bad "no archive listing: $(tail -n 5 "$W/run.txt")"

# the CPU bench train ran 1 warm-up + 2 timed steps; the stand-in ncu logs 1 ms a step and the probe's GEMMs when
# the command does not say --no-gemm-probe
grep -q '^steps run *3 ' "$W/x/ncu-run.txt" && ok "bench train says how many steps it ran" ||
    bad "ncu-run.txt: $(head -n 5 "$W/x/ncu-run.txt")"
grep -q '1.00 ms of GPU time per step over 3 step(s)' "$W/x/kernel-times.txt" &&
    grep -qE '^ +1\.000 .*train_step_kernel$' "$W/x/kernel-times.txt" &&
    ok "profile: kernel totals divided by the steps run" || bad "kernel-times.txt: $(cat "$W/x/kernel-times.txt")"
grep -q 'gemm' "$W/x/kernel-times.txt" && bad "profile: probe GEMMs in the kernel rows" ||
    ok "profile: no probe GEMM in the kernel rows"
grep -q 'vs_pytorch_gpu exit 0' "$W/run.txt" && grep -q 'torch.compile exit 0' "$W/run.txt" &&
    ok "the PyTorch benchmark knows every option the session passes" || bad "$(grep -E 'has no option|gpu exit|compile exit' "$W/run.txt")"
n=$(grep -c '^async (round\|^sm90 (round' "$W/run.txt")
[ "$n" -eq 4 ] && ! grep -q '^async (round [12], exit [1-9]\|^sm90 (round [12], exit [1-9]' "$W/run.txt" &&
    ok "experts: four bench train runs" || bad "experts: $(grep 'round' "$W/run.txt")"
n=$(grep -c '^own (round\|^cudnn (round' "$W/run.txt")
[ "$n" -eq 4 ] && ! grep -q '^own (round [12], exit [1-9]\|^cudnn (round [12], exit [1-9]' "$W/run.txt" &&
    ok "attention: four bench train runs" || bad "attention: $(grep 'round' "$W/run.txt")"
n=$(grep -c '^fp32 (round\|^tc (round' "$W/run.txt")
[ "$n" -eq 4 ] && ! grep -q '^fp32 (round [12], exit [1-9]\|^tc (round [12], exit [1-9]' "$W/run.txt" &&
    ok "conv: four bench train runs" || bad "conv: $(grep 'round' "$W/run.txt")"
# window and muon both switch a variable off and on: eight runs
n=$(grep -c '^off (round\|^on (round' "$W/run.txt")
[ "$n" -eq 8 ] && ! grep -q '^off (round [12], exit [1-9]\|^on (round [12], exit [1-9]' "$W/run.txt" &&
    grep -q 'optimizer Muon + AdamW' "$W/x/optimizer-on-1.txt" && ok "muon: four bench train runs with Muon + AdamW" ||
    bad "muon: $(grep 'round' "$W/run.txt"; grep -i '^batch' "$W/x/optimizer-on-1.txt")"
n=$(grep -c '^0 (round\|^1 (round' "$W/run.txt")
[ "$n" -eq 4 ] && ! grep -q '^0 (round [12], exit [1-9]\|^1 (round [12], exit [1-9]' "$W/run.txt" &&
    [ -s "$W/x/graphs-0-1.txt" ] && [ -s "$W/x/graphs-1-2.txt" ] && ok "graphs: four bench train runs" ||
    bad "graphs: $(grep 'round' "$W/run.txt")"
grep -q '^model .*tiny-sliding.json' "$W/x/attention-off-1.txt" && grep -q '^model .*tiny-sliding.json' "$W/x/attention-on-2.txt" &&
    ok "window: four bench train runs on the sliding-window model" ||
    bad "window: $(grep -i '^model' "$W/x/attention-off-1.txt" "$W/x/attention-on-2.txt")"
grep -q '^unit: [1-9][0-9]* passed, 0 failed' "$W/x/test-gpu.log" && grep -q '^unit: [1-9][0-9]* passed' "$W/run.txt" &&
    ok "tests part ran its stand-in and showed its suite line" ||
    bad "test-gpu.log: $(tail -n 3 "$W/x/test-gpu.log")"
# the train part: bench train with gradient accumulation (the dry run's 2 micro-batches of 2 x 32), and the PyTorch
# comparison given the same --micro-batches (on the device: 8 of 4 x 2048, an optimizer step of 64K tokens)
grep -q '^batch  *2 micro-batches of 2 x 32 = 128 tokens per optimizer step' "$W/x/train-8b-slice.txt" &&
    grep -q '^bench train exit 0' "$W/run.txt" && ok "train: bench train --micro-batches ran" ||
    bad "train-8b-slice.txt: $(head -n 5 "$W/x/train-8b-slice.txt")"
grep -q 'vs_pytorch_gpu 8b-slice exit 0' "$W/run.txt" && grep -q -- '--micro-batches 2 ' "$W/x/vs-pytorch-8b-slice.txt" &&
    ok "train: vs_pytorch_gpu.py knows --micro-batches and is given it" || bad "$(grep '8b-slice' "$W/run.txt")"
grep -q '^MICRO=8$\|SLICE=configs/bench-gpu-8b-slice.json MICRO=8' tests/gpu/device-session.sh &&
    grep -q '^    DEV=cuda CFG=configs/bench-gpu.json BATCH=4 SEQ=2048 ' tests/gpu/device-session.sh &&
    ok "train: on the device 8 x 4 x 2048 = 65,536 tokens an optimizer step" || bad "train: the device's shapes changed"
# pair: zaya's bench train and the compile worker both ran; slice: both optimizers with the accumulation; decode: four
# runs, each KV dtype at each batch
grep -q '^zaya (exit 0): step median' "$W/run.txt" && grep -q -- '--worker compile' "$W/x/pair-compile.txt" &&
    ok "pair: zaya's steps and the torch.compile worker's options" || bad "pair: $(grep -E '^zaya \(|compile' "$W/run.txt")"
[ "$(grep -c '^\(adamw\|muon\) (exit 0): step median' "$W/run.txt")" -eq 2 ] &&
    grep -q '^batch  *2 micro-batches of 2 x 32 = 128 tokens per optimizer step' "$W/x/slice-muon.txt" &&
    ok "slice: AdamW and Muon + AdamW with --micro-batches" || bad "slice: $(grep -E '^(adamw|muon) ' "$W/run.txt")"
[ "$(grep -c '^batch \(1\|32\), KV \(f32\|bf16\) (exit 0): decode ' "$W/run.txt")" -eq 4 ] &&
    grep -q 'k and v bf16' "$W/x/decode-b32-bf16.txt" && grep -q 'k and v f32' "$W/x/decode-b1-f32.txt" &&
    ok "decode: batch 1 and 32, fp32 and bf16 KV cache" || bad "decode: $(grep -E '^batch (1|32), KV' "$W/run.txt")"
grep -q 'vs_pytorch_gpu decode 8b exit 0' "$W/run.txt" && grep -q -- '--decode-only --decode-path pool' "$W/x/decode-8b.txt" &&
    grep -q 'CFG8B=configs/zaya1-8b.json' tests/gpu/device-session.sh &&
    ok "decode8b: vs_pytorch_gpu.py knows --decode-only and --decode-path, on ZAYA1-8B's schema" ||
    bad "decode8b: $(grep -E 'decode 8b|has no option' "$W/run.txt")"
grep -q 'serve_bench exit 0' "$W/run.txt" && grep -q -- '--gpu-graphs' "$W/x/serve.txt" &&
    ok "serve: serve_bench.py knows --device and --gpu-graphs" || bad "serve: $(grep -E 'serve_bench|has no option' "$W/run.txt")"
# the benchmark at ZAYA1-8B's real shapes: its widths and vocabulary exactly, 8 layers
python3 - <<'PY' && ok "configs/bench-gpu-8b-slice.json: configs/zaya1-8b.json with 8 layers" || bad "bench-gpu-8b-slice drifted"
import json, sys
full, cut = json.load(open("configs/zaya1-8b.json")), json.load(open("configs/bench-gpu-8b-slice.json"))
diff = sorted(k for k in set(full) | set(cut) if full.get(k) != cut.get(k))
sys.exit(diff != ["layer_types", "num_hidden_layers"] or cut["num_hidden_layers"] != 8
         or cut["layer_types"] != full["layer_types"][:8])
PY
finish
