#!/usr/bin/env python3
"""Compares two training runs' metrics.jsonl (tests/gpu/run.sh).

  curve A B        B's loss curve tracks A's: same steps; mean |Δloss| over the steps ≤ 0.05 and |Δ| ≤ 3% of A's at the
                   end (bf16 products on two devices sum in different orders: close curves, not equal ones)
  identical A B    the same losses and gradient norms at every step, bit for bit, and identical final weights
  prefix A B N     the first N steps of both are bit-identical
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


def main():
    mode, a, b = sys.argv[1], sys.argv[2], sys.argv[3]
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
