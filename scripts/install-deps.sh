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
# Where the CUDA toolkit is, the GPU build's header-only libraries from PyPI (--no-deps: their Python interfaces'
# packages are not needed), pinned to the versions it is checked with (nvcc 13.0):
#   nvidia-cutlass: CUTLASS, the experts' grouped products on Hopper's wgmma + TMA (src/gpu/gpu_expert_gemm_sm90.cu);
#   nvidia-cudnn-frontend + nvidia-cudnn-cu13 (cudnn.h; PyTorch already brings it): cuDNN's fused attention
#   (src/gpu/gpu_attention_cudnn.cpp), whose library is loaded at run time.
has_module() { python3 -c "import importlib.util as u, sys; sys.exit(u.find_spec('$1') is None)" 2>/dev/null; }
if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
    gpu_pkgs=()
    has_module cutlass_library || gpu_pkgs+=(nvidia-cutlass==4.2.0.0)
    has_module cudnn || gpu_pkgs+=(nvidia-cudnn-frontend==1.32.0)
    has_module nvidia.cudnn || gpu_pkgs+=(nvidia-cudnn-cu13)
    if [ ${#gpu_pkgs[@]} -gt 0 ]; then
        echo "[deps] python3 -m pip install --no-deps ${gpu_pkgs[*]} (headers for the GPU build)"
        python3 -m pip install -q --no-deps "${gpu_pkgs[@]}"
    fi
fi
echo "[deps] ok"
