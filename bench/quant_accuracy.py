#!/usr/bin/env python3
"""Accuracy and speed of quantized weights on a trained model (docs/quantization.md's tables).

For each variant — bf16; then for each --methods value (zaya quantize --method: mlx's min/max rule, mse's least
squared error) q8 and q4 (zaya quantize's default plan: the router at 8 bits in groups of 64) at groups of
32/64/128; with --router-4bit q4 with the router at 4 bits too; and, with --classes, q4 of one class of matrices at a time (the others
left unquantized: --keep-float); with --calibration, q8 and q4 fitted to the train split's activations (--method mse
--calibration) — it measures
  - held-out loss: `zaya eval --shards DATA --max-tokens N --seq-len 128` (the full forward),
  - greedy top-1 agreement with bf16: the argmax of `zaya forward --logits-out` at every position of WINDOWS
    held-out windows of 128 tokens, against bf16's,
  - task scores: `zaya eval --task ... --limit N` (with --tasks),
  - bytes per token and decode tokens/s: `zaya bench decode --context 128 --tokens 64` (with --speed),
and prints one table row per variant (also appended to --out).

    python3 bench/quant_accuracy.py --model DIR --data SHARDS [--tokenizer T --tasks A.jsonl,B.jsonl --limit N]
        [--groups 32,64,128] [--methods mlx,mse] [--calibration SHARDS] [--router-4bit] [--classes] [--speed] [--work DIR] [--out FILE] [--label TEXT]

The model folder must hold unquantized (fp32 or bf16) weights; quantized copies go under --work.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
ZAYA = os.environ.get("ZAYA", str(ROOT / "build" / "zaya"))
CLASSES = ("attention", "router", "experts", "embedding")


class Refused(Exception):
    pass


def zaya(*args):
    r = subprocess.run([ZAYA, *map(str, args)], capture_output=True, text=True)
    if r.returncode != 0:
        raise Refused(f"zaya {' '.join(map(str, args))} failed ({r.returncode}): {r.stderr.strip()[-600:]}")
    return r.stdout + r.stderr


def held_out_windows(data, n, T):
    """n windows of T tokens, evenly spaced over the held-out split's first shard (64-byte header, then tokens)."""
    meta = json.loads((Path(data) / "meta.json").read_text())
    dtype = np.uint16 if meta["dtype"] == "uint16" else np.uint32
    toks = np.fromfile(Path(data) / meta["splits"]["val"]["shards"][0]["file"], dtype=np.uint8)[64:].view(dtype)
    step = (len(toks) - T) // n
    return np.stack([toks[i * step: i * step + T] for i in range(n)]).astype(np.int32)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True, help="token shards; the held-out (val) split is scored")
    ap.add_argument("--tokenizer")
    ap.add_argument("--tasks", default="", help="comma-separated task files for zaya eval --task")
    ap.add_argument("--limit", type=int, default=200, help="examples per task")
    ap.add_argument("--max-tokens", type=int, default=20000)
    ap.add_argument("--windows", type=int, default=16)
    ap.add_argument("--groups", default="32,64,128")
    ap.add_argument("--methods", default="mlx,mse",
                    help="zaya quantize --method values to measure, each for every q8/q4 variant (rows named by it)")
    ap.add_argument("--calibration", help="token shards whose train split calibrates: also q8/q4 rows quantized with "
                    "--method mse --calibration (activation-aware)")
    ap.add_argument("--calibration-tokens", type=int, default=16384)
    ap.add_argument("--calibration-methods", default="mse", help="the methods calibrated rows use (mse, gptq)")
    ap.add_argument("--bits", default="8,4", help="the q8/q4 rows to measure")
    ap.add_argument("--router-4bit", action="store_true", help="also q4 with the router at 4 bits")
    ap.add_argument("--classes", action="store_true", help="also q4 (groups of 32) of one class at a time")
    ap.add_argument("--speed", action="store_true", help="also bench decode (bytes per token, tokens/s)")
    ap.add_argument("--work", help="folder for the quantized copies (default: a temporary one, removed)")
    ap.add_argument("--out", help="append the table here too")
    ap.add_argument("--label", default="")
    a = ap.parse_args()

    work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="zaya-qacc."))
    work.mkdir(parents=True, exist_ok=True)
    tokens = work / "windows.npy"
    np.save(tokens, held_out_windows(a.data, a.windows, 128))
    groups = [int(g) for g in a.groups.split(",")]
    bit_list = [int(b) for b in a.bits.split(",")]
    variants = [("bf16", a.model, "bf16", [])]
    for m in filter(None, a.methods.split(",")):
        meth = ["--method", m]
        for bits in bit_list:
            for g in groups:
                variants.append((f"q{bits} g{g} {m}", None, f"q{bits}", ["--bits", bits, "--group-size", g, *meth]))
        if a.router_4bit:
            for g in groups:
                variants.append((f"q4 g{g} {m}, router 4-bit", None, "q4",
                                 ["--bits", 4, "--group-size", g, "--router-bits", 4, *meth]))
        if a.classes:
            for c in CLASSES:
                others = ",".join(x for x in CLASSES if x != c)
                variants.append((f"q4 g32 {m} {c} only", None, "q4",
                                 ["--bits", 4, "--group-size", 32, "--router-bits", 4, "--keep-float", others, *meth]))

    if a.calibration:
        for m in a.calibration_methods.split(","):
            cal = ["--method", m, "--calibration", a.calibration, "--calibration-tokens", a.calibration_tokens]
            for bits in bit_list:
                for g in groups:
                    variants.append((f"q{bits} g{g} {m} calibrated", None, f"q{bits}",
                                     ["--bits", bits, "--group-size", g, *cal]))

    lines = [f"# {a.label}".rstrip(), f"# model {a.model}, held-out loss on {a.max_tokens} tokens of {a.data} (seq 128), "
             f"top-1 on {a.windows} x 128 positions", ""]
    head = "| weights | held-out loss | vs bf16 | top-1 = bf16 |"
    sep = "|---|---|---|---|"
    if a.tasks:
        names = [Path(t).stem for t in a.tasks.split(",")]
        head += "".join(f" {n} |" for n in names)
        sep += "---|" * len(names)
    if a.speed:
        head += " bytes/token | decode tokens/s | bound, tokens/s |"
        sep += "---|---|---|"
    lines += [head, sep]
    print("\n".join(lines), flush=True)
    ref_top1 = ref_loss = None
    for name, folder, dtype, qargs in variants:
        if folder is None:
            folder = work / re.sub(r"[^a-z0-9]+", "-", name)
            if not (folder / "config.json").exists():
                try:
                    zaya("quantize", "--model", a.model, "--out", folder, *qargs)
                except Refused as e:  # a group size that does not divide a width: say so in the table
                    why = re.search(r'tensor "([^"]+)".*?its width (\d+)', str(e))
                    row = f"| {name} | refused: {why.group(1) if why else e}, width {why.group(2) if why else '?'} |"
                    print(row, flush=True)
                    lines.append(row)
                    continue
        ev = [] if not a.tasks else ["--tokenizer", a.tokenizer, "--task", *a.tasks.split(","), "--limit", a.limit]
        zaya("eval", "--model", folder, "--dtype", dtype, "--shards", a.data, "--max-tokens", a.max_tokens,
             "--seq-len", 128, "--json", work / "eval.json", *ev)
        res = json.loads((work / "eval.json").read_text())
        loss = res["heldout"]["loss"]
        zaya("forward", "--model", folder, "--dtype", dtype, "--tokens", tokens, "--logits-out", work / "logits.npy")
        top1 = np.load(work / "logits.npy").argmax(-1)
        if ref_top1 is None:
            ref_top1, ref_loss = top1, loss
        row = (f"| {name} | {loss:.4f} | {100 * (loss / ref_loss - 1):+.2f}% | "
               f"{100 * (top1 == ref_top1).mean():.1f}% |")
        if a.tasks:
            for t in res["tasks"]:
                score = t.get("acc", t.get("exact_match"))
                row += f" {round(score * t['n'])}/{t['n']} |"
        if a.speed:
            out = zaya("bench", "decode", "--model", folder, "--dtype", dtype, "--context", 128, "--tokens", 64)
            mb = re.search(r"([\d.]+) MB read per decoding step", out)
            tps = re.search(r"decode .*?, (\d+) tokens/s", out)
            bound = re.search(r"decoding at most ([\d.]+) tokens/s", out)
            row += f" {mb.group(1) if mb else '?'} MB | {tps.group(1) if tps else '?'} | " \
                   f"{bound.group(1) if bound else '?'} |"
        print(row, flush=True)
        lines.append(row)
    if a.out:
        with open(a.out, "a") as f:
            f.write("\n".join(lines) + "\n\n")
    if not a.work:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
