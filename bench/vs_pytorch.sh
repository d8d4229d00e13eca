#!/usr/bin/env bash
# Side-by-side benchmark against PyTorch + transformers (see bench/vs_pytorch.py for the options).
set -euo pipefail
cd "$(dirname "$0")/.."
make --no-print-directory all >/dev/null
python3 bench/vs_pytorch.py "$@"
