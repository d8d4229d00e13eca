#!/usr/bin/env bash
# One lent-GPU session's checks in one call (README "GPUs"): the GPU machine has no package registry and device time
# is short, so this runs the whole of `make test-gpu` and the GPU benchmarks back to back, each under a time limit,
# and leaves every log under $OUT. Prepared here, on the CPU machine:
#   pack-debs.sh .devdeps   (the workplace's script that packs these Debian packages and their dependencies) mpi libmicrohttpd12 libmicrohttpd-dev libutf8proc2 libutf8proc-dev
#   make BUILD=build-dev DNNL=0 CUDA_ARCH="-gencode arch=compute_90,code=sm_90" build-dev/zaya build-dev/zaya_gpu_tests
#   mkdir -p .devbin && strip --strip-debug -o .devbin/zaya build-dev/zaya && strip --strip-debug -o .devbin/zaya_gpu_tests build-dev/zaya_gpu_tests
# and a transformers wheel that knows ZAYA in .whl/. Then carry .devdeps .devbin .whl runs/demo/data/general
# runs/demo/data/mathcode runs/demo/tokenizer.json runs/demo/corpus/eval (else run.sh makes the demo data there) and run
#   tests/gpu/device-session.sh [seconds] [parts]   (default 480 s; parts, comma-separated, default tests,bench:
#     tests    make test-gpu (tests/gpu/run.sh)
#     bench    zaya bench gemm, then bench/vs_pytorch_gpu.py without torch.compile (training and decoding)
#     experts  bench train (bf16 AdamW, bench-gpu) with the experts' products grouped vs one per expert
#              (ZAYA_GPU_EXPERTS=grouped / loop), alternating, two rounds
#     compile  PyTorch torch.compile training steps alone, in whatever time is left
#     profile  per-kernel GPU times (ncu) of bf16 AdamW training steps on configs/bench-gpu.json cut to 2 layers:
#              every kernel's shape is bench-gpu's, a layer's kernels counted 9 times give the 18-layer step)
# Without .devbin (or if the carried binaries do not load there) it builds on the machine.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUDGET=${1:-480}
PARTS=",${2:-tests,bench},"
OUT=${OUT:-/tmp/zaya-gpu-out}
mkdir -p "$OUT"
T0=$(date +%s)
elapsed() { echo $(($(date +%s) - T0)); }
stamp() { echo "[$(elapsed) s] $*"; }
left() { local l=$((BUDGET - $(elapsed))); [ "$l" -lt 10 ] && l=10; echo "$l"; }

[ -f .devdeps/use.sh ] && source .devdeps/use.sh
if [ -d /opt/devdeps/usr/bin ]; then
    # Open MPI unpacked away from /usr: the alternatives links (mpirun, ...) are made by postinst scripts that do not
    # run there, and OPAL_PREFIX points it at its helpers and components
    for n in mpirun mpiexec mpicc; do [ -e /opt/devdeps/usr/bin/$n.openmpi ] && ln -sf $n.openmpi /opt/devdeps/usr/bin/$n; done
    export OPAL_PREFIX=/opt/devdeps/usr
fi
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl &&
        export PYTHONPATH=/tmp/site
fi
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
python3 -c 'import transformers, torch; print("transformers", transformers.__version__, "torch", torch.__version__)'

mkdir -p build
[ -x .devbin/zaya ] && cp .devbin/zaya .devbin/zaya_gpu_tests build/
if [ -x build/zaya ] && ldd build/zaya | grep -q 'not found'; then
    # the CUDA libraries may live in the Python wheels rather than /usr/local/cuda
    for d in $(python3 -c 'import nvidia, os; p = nvidia.__path__[0]; print(" ".join(os.path.join(p, x, "lib") for x in os.listdir(p)))' 2>/dev/null); do
        [ -d "$d" ] && LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$d
    done
    export LD_LIBRARY_PATH
    ldd build/zaya | grep 'not found'
fi
if ! build/zaya info >/dev/null 2>&1; then
    stamp "the carried binaries do not run here: building"
    make -j16 DNNL=0 CUDA_ARCH="-gencode arch=compute_90,code=sm_90" all >"$OUT/build.log" 2>&1 || {
        tail -n 40 "$OUT/build.log"
        exit 1
    }
fi
build/zaya info
if [[ $PARTS == *,tests,* ]]; then
    stamp "make test-gpu (tests/gpu/run.sh)"
    ZAYA_GPU_TEST_DIR=/tmp/gpu-test timeout $((BUDGET * 6 / 10)) tests/gpu/run.sh >"$OUT/test-gpu.log" 2>&1
    echo "run.sh exit $?"
    grep -E '^(=== suite|zaya gpu tests|gpu tests:|[a-z-]+: [0-9]+ passed|  FAIL |FAIL |[0-9]+ passed, [0-9]+ failed)' "$OUT/test-gpu.log" |
        head -n 70
    # the worst gradients of the whole-model comparisons, and the oracle's per-config lines
    grep -E '^ +ok +model .*every gradient|^       .*rel err|^(ok  |FAIL) cfg' "$OUT/test-gpu.log" | cut -c1-180 | head -n 60
fi
if [[ $PARTS == *,bench,* ]]; then
    stamp "benchmarks"
    build/zaya bench gemm --device cuda >"$OUT/bench-gemm.txt" 2>&1
    tail -n 6 "$OUT/bench-gemm.txt"
    PYTHONUNBUFFERED=1 timeout "$(left)" python3 bench/vs_pytorch_gpu.py --config configs/bench-gpu.json --batch 4 --seq 2048 \
        --steps 5 --no-compile >"$OUT/vs-pytorch.txt" 2>&1
    echo "vs_pytorch_gpu exit $?"
    grep -v '^json' "$OUT/vs-pytorch.txt" | tail -n 45
fi
if [[ $PARTS == *,experts,* ]]; then
    # the experts' products grouped on the device (default) against one cuBLASLt product per expert, side by side,
    # alternating, on bench-gpu (bf16 AdamW): step medians and the phase breakdown's experts line
    stamp "experts: grouped vs per-expert products"
    for round in 1 2; do
        for mode in grouped loop; do
            ZAYA_GPU_EXPERTS=$mode timeout "$(left)" build/zaya bench train --config configs/bench-gpu.json --device cuda \
                --precision bf16 --optimizer adamw --batch 4 --seq 2048 --steps 3 --warmup 1 \
                >"$OUT/experts-$mode-$round.txt" 2>&1
            echo "$mode (round $round, exit $?): $(grep -E '^(step|throughput|products) ' "$OUT/experts-$mode-$round.txt" | tr -s ' ' | tr '\n' ';')"
            grep -E '^ +experts ' "$OUT/experts-$mode-$round.txt"
        done
    done
fi
if [[ $PARTS == *,compile,* ]]; then
    stamp "torch.compile training steps (bench/vs_pytorch_gpu.py's compile worker, $(left) s at most)"
    PYTHONUNBUFFERED=1 timeout "$(left)" python3 bench/vs_pytorch_gpu.py --worker compile --config configs/bench-gpu.json \
        --batch 4 --seq 2048 --steps 5 --compile-warmup 4 >"$OUT/compile.txt" 2>&1
    echo "torch.compile exit $? (124: still compiling when the time ran out)"
    tail -n 3 "$OUT/compile.txt"
fi
if [[ $PARTS == *,profile,* ]]; then
    # ncu replays each kernel to time it alone (--clock-control none: the clocks a run gets): seconds per hundred
    # launches, so a 2-layer model (bench-gpu's shapes, 1/9 of its layers) and one warm-up plus one timed step
    stamp "per-kernel times (ncu), $(left) s at most"
    python3 -c 'import json; c = json.load(open("configs/bench-gpu.json")); c["num_hidden_layers"] = 2; json.dump(c, open("/tmp/bench-gpu-2l.json", "w"))'
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -n 1)
    timeout "$(left)" "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv --log-file "$OUT/ncu.csv" \
        build/zaya bench train --config /tmp/bench-gpu-2l.json --device cuda --precision bf16 --optimizer adamw \
        --batch 4 --seq 2048 --steps 1 --warmup 1 >"$OUT/ncu-run.txt" 2>&1
    echo "ncu exit $?"
    python3 tests/gpu/kernel_times.py "$OUT/ncu.csv" --steps 2 | tee "$OUT/kernel-times.txt" | head -n 40
fi
stamp "done"
