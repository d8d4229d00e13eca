#!/usr/bin/env python3
"""Stands in for ncu in tests/gpu/device-session.sh's dry run (ZAYA_DEVICE_DRY=1, no GPU): runs the command as ncu
would, then writes an ncu-shaped CSV log (--log-file) with one 1 ms kernel per training step the command says it ran
("steps run N" in zaya bench train's output) and, as the real binary does unless given --no-gemm-probe, the cuBLASLt
peak probe's 23 GEMMs. The session's per-kernel table must then show exactly 1 ms per step and no probe row.

Usage: fake_ncu.py [ncu options] --log-file F COMMAND ARGS..."""
import re
import subprocess
import sys

args = sys.argv[1:]
log = None
while args and args[0].startswith("--"):  # ncu's options; the command follows them
    opt = args.pop(0)
    if opt in ("--clock-control", "--metrics", "--log-file"):
        val = args.pop(0)
        if opt == "--log-file":
            log = val
if log is None or not args:
    sys.exit("fake_ncu.py: usage: fake_ncu.py [ncu options] --log-file F COMMAND ARGS...")
run = subprocess.run(args, capture_output=True, text=True)
sys.stdout.write(run.stdout)
sys.stderr.write(run.stderr)
m = re.search(r"^steps run +(\d+)", run.stdout, re.M)
steps = int(m.group(1)) if m else 0
rows = [("void train_step_kernel<float>(float *)", 1.0)] * steps
if "--no-gemm-probe" not in args:
    rows += [("sm90_xmma_gemm_bf16bf16_bf16f32", 5.0)] * 23
with open(log, "w") as f:
    f.write("==PROF== fake ncu (device-session.sh dry run)\n")
    f.write('"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\n')
    for i, (name, ms) in enumerate(rows):
        f.write(f'"{i}","{name}","gpu__time_duration.sum","msecond","{ms:.3f}"\n')
sys.exit(run.returncode)
