#!/usr/bin/env python3
"""Compares two training runs' metrics.jsonl (tests/gpu/run.sh).

  curve A B        B's loss curve tracks A's: same steps; mean |Δloss| over the steps ≤ 0.05 and |Δ| ≤ 3% of A's at the
                   end (bf16 products on two devices sum in different orders: close curves, not equal ones)
  identical A B    the same losses and gradient norms at every step, bit for bit, and identical final weights
  prefix A B N     the first N steps of both are bit-identical
  eval A B         two `zaya eval --json` results (CPU, GPU) agree: per task the same n, accuracies / exact match
                   within one example (an fp32 near-tie may flip), ppl within 1e-4 relative; the held-out loss within
                   1e-5 relative over the same tokens; routing over the same windows with skip rates within 1e-3
"""
import json
import sys
from pathlib import Path


def steps(run):
    out = {}
    for line in (Path(run) / "metrics.jsonl").read_text().splitlines():
        o = json.loads(line)
        if "loss" in o and "grad_norm" in o:
            out[o["step"]] = (o["loss"], o["grad_norm"])
    return out


def compare_eval(a, b):
    A, B = json.loads(Path(a).read_text()), json.loads(Path(b).read_text())
    ta, tb = A["tasks"], B["tasks"]
    assert [t["task"] for t in ta] == [t["task"] for t in tb] and ta, "different task lists"
    for x, y in zip(ta, tb):
        assert x["n"] == y["n"], f"{x['task']}: n {x['n']} vs {y['n']}"
        for k in ("acc", "acc_norm", "exact_match"):
            if k in x:
                assert abs(x[k] - y[k]) <= 1.0 / x["n"] + 1e-12, f"{x['task']} {k}: {x[k]} vs {y[k]}"
        if "ppl" in x:
            assert abs(x["ppl"] - y["ppl"]) <= 1e-4 * x["ppl"], f"{x['task']} ppl: {x['ppl']} vs {y['ppl']}"
    ha, hb = A["heldout"], B["heldout"]
    assert ha["tokens"] == hb["tokens"] > 0, f"held-out tokens {ha['tokens']} vs {hb['tokens']}"
    assert abs(ha["loss"] - hb["loss"]) <= 1e-5 * abs(ha["loss"]), f"held-out loss {ha['loss']} vs {hb['loss']}"
    ra, rb = A["routing"], B["routing"]
    assert ra["windows"] == rb["windows"] > 0 and len(ra["layers"]) == len(rb["layers"]), "routing windows differ"
    for x, y in zip(ra["layers"], rb["layers"]):
        assert x["tokens"] == y["tokens"] and abs(x["skip_rate"] - y["skip_rate"]) <= 1e-3, f"layer {x['layer']}"
    print("       " + ", ".join(f"{t['task']} {t.get('acc', t.get('exact_match')):.3f}/{u.get('acc', u.get('exact_match')):.3f}"
                                for t, u in zip(ta, tb)) + f"; held-out loss {ha['loss']:.6f}/{hb['loss']:.6f}")


def main():
    mode, a, b = sys.argv[1], sys.argv[2], sys.argv[3]
    if mode == "eval":
        compare_eval(a, b)
        return
    A, B = steps(a), steps(b)
    if mode == "curve":
        assert sorted(A) == sorted(B) and A, f"steps differ: {len(A)} vs {len(B)}"
        diffs = [abs(A[s][0] - B[s][0]) for s in sorted(A)]
        mean = sum(diffs) / len(diffs)
        last = max(A)
        end = abs(A[last][0] - B[last][0]) / A[last][0]
        print(f"{len(A)} steps; loss {A[min(A)][0]:.4f} -> {A[last][0]:.4f} (A) vs {B[last][0]:.4f} (B); "
              f"mean |dloss| {mean:.4f}; end {100 * end:.2f}%")
        assert mean <= 0.05 and end <= 0.03, "curves apart"
    elif mode == "identical":
        assert A == B, "metrics differ: " + str([(s, A.get(s), B.get(s)) for s in sorted(A) if A.get(s) != B.get(s)][:3])
        wa = (Path(a) / "final" / "model.safetensors").read_bytes()
        wb = (Path(b) / "final" / "model.safetensors").read_bytes()
        assert wa == wb, "final weights differ"
        print(f"{len(A)} steps identical; final weights identical ({len(wa)} bytes)")
    elif mode == "prefix":
        n = int(sys.argv[4])
        for s in range(1, n + 1):
            assert A[s] == B[s], f"step {s}: {A[s]} vs {B[s]}"
        print(f"first {n} steps identical")
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
