#!/usr/bin/env bash
# Installs what zaya needs on a fresh Debian machine, skipping whatever is already there:
# C libraries from apt, the Python test oracle (torch, transformers, openai, lm-eval; mlx for the quantized format) from PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."

# libclang-rt-dev: the sanitizer and libFuzzer runtimes of the default clang (14 on bookworm: libclang-rt-14-dev).
# libmicrohttpd-dev: zaya serve's HTTP server. qemu-user: tests/cli/test_portable.sh runs the binary on emulated older CPUs. libdnnl-dev: oneDNN, the bf16 products.
APT_PKGS=(build-essential clang libclang-rt-dev qemu-user libdnnl-dev libopenblas-dev libopenblas0-openmp libcjson-dev libomp-dev libpcre2-dev libutf8proc-dev zlib1g-dev libmicrohttpd-dev gnuplot-nox openmpi-bin libopenmpi-dev)
# CI's strict checks (ZAYA_STRICT=1, tests/run_all.sh) also compile the GPU kernels for AMD GPUs with Debian's hipcc
# (tests/hip_check.sh): not needed to build or run zaya.
[ "${ZAYA_STRICT:-0}" = 1 ] && APT_PKGS+=(hipcc libamdhip64-dev)
missing=()
for p in "${APT_PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "[deps] apt-get install ${missing[*]}"
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"
fi

if ! python3 - <<'PY' 2>/dev/null
import importlib, sys
for m in ("numpy", "torch", "transformers", "safetensors", "tokenizers", "openai", "jsonschema", "lm_eval", "tenacity", "aiohttp", "mlx.core"):
    importlib.import_module(m)
import transformers
from transformers import ZayaForCausalLM  # noqa: F401
PY
then
    echo "[deps] python3 -m pip install -r tests/requirements.txt"
    python3 -m pip install -q -r tests/requirements.txt
fi
# CUTLASS's headers where the CUDA toolkit is (PyPI's nvidia-cutlass, headers only: --no-deps skips its Python
# interface's packages): the experts' grouped products on Hopper's wgmma + TMA (src/gpu/gpu_expert_gemm_sm90.cu).
# Pinned to the version the GPU build is checked with (nvcc 13.0).
if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
    if ! python3 -c 'import importlib.util as u, sys; sys.exit(u.find_spec("cutlass_library") is None)' 2>/dev/null; then
        echo "[deps] python3 -m pip install --no-deps nvidia-cutlass==4.2.0.0 (CUTLASS's headers, for the GPU build)"
        python3 -m pip install -q --no-deps nvidia-cutlass==4.2.0.0
    fi
fi
echo "[deps] ok"
