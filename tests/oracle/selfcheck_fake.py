#!/usr/bin/env python3
"""Validates the oracle itself (not zaya): runs test_oracle.py against fake_zaya.py, an HF-backed stand-in that
computes with a different numerical path (sdpa + grouped_mm, or float64), and expects every check to pass; then
injects one bug at a time and expects the matching check to fail. Slow-ish (each fake call starts Python and
transformers, ~5 s), so it is not part of the test suite (the name does not match test_*.py).

    python tests/oracle/selfcheck_fake.py
"""
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
FAKE = f"{sys.executable} {HERE / 'fake_zaya.py'}"

# (FAKE_ZAYA_BUG, FAKE_ZAYA_F64, configs, expected result, a check that must be among the failures)
CASES = [
    ("", "", "cfg3,cfg5,cfg6", "pass", None),
    ("", "1", "cfg2,cfg4", "pass", None),
    ("temp_exp", "", "cfg3", "fail", "cfg3 logits"),
    ("pad_grad", "", "cfg3", "fail", "cfg3 grads"),
    ("no_eda", "", "cfg2", "fail", "cfg2 logits"),
    ("routing", "", "cfg3", "fail", "cfg3 routing"),
    ("drop_grad", "", "cfg3", "fail", "cfg3 grad-names"),
    ("extra_grad", "", "cfg3", "fail", "cfg3 grad-names"),
    ("grad_scale", "", "cfg3", "fail", "cfg3 grads"),
    ("loss_digits", "", "cfg3", "fail", "cfg3 loss"),
    ("logits_eps", "", "cfg3", "fail", "cfg3 logits"),
]


def main():
    bad = 0
    for bug, f64, only, want, must in CASES:
        env = dict(os.environ, ZAYA_BIN=FAKE, FAKE_ZAYA_BUG=bug, FAKE_ZAYA_F64=f64)
        p = subprocess.run([sys.executable, str(HERE / "test_oracle.py"), "--only", only], env=env,
                           capture_output=True, text=True)
        got = "pass" if p.returncode == 0 else "fail"
        ok = got == want and (must is None or f"FAIL {must}:" in p.stdout)
        bad += not ok
        summary = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else p.stderr.strip()[-200:]
        print(f"{'ok  ' if ok else 'BAD '} bug={bug or '-'} f64={f64 or '-'} {only}: expected {want}, got {got} "
              f"({summary})", flush=True)
    print(f"selfcheck: {len(CASES) - bad} passed, {bad} failed")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
