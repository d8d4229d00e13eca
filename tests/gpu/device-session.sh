#!/usr/bin/env bash
# One lent-GPU session's checks in one call (docs/gpus.md "Next GPU session"): the GPU machine has no package registry,
# device time is short (15 minutes in all, the machine's start included) and at most 8 files come back, so this runs
# `make test-gpu` and the GPU benchmarks back to back, each under a time limit, and returns every log packed in ONE
# archive, $OUT/gpu-session.tar.gz, beside $OUT/summary.txt (its own output). Prepared on the CPU machine, in the
# checkout the device receives (the lead's /work/main, after the merge), with the carried folders git-ignored:
#   printf '/.devdeps/\n/.devbin/\n/.whl/\n' >>.git/info/exclude
#   pack-debs.sh .devdeps mpi libmicrohttpd12 libmicrohttpd-dev libutf8proc2 libutf8proc-dev
#       (the workplace's script that packs these Debian packages and their dependencies)
#   make -j2 BUILD=build-dev DNNL=0 CUDA_ARCH="-gencode arch=compute_90a,code=sm_90a" build-dev/zaya build-dev/zaya_gpu_tests
#   mkdir -p .devbin && for b in zaya zaya_gpu_tests; do strip --strip-debug -o .devbin/$b build-dev/$b &&
#       gzip -9f .devbin/$b; done   (gzipped: ~4 MB each instead of ~14 with CUTLASS and cuDNN's frontend in)
#   a transformers wheel that knows ZAYA in .whl/ (pip download, README of the device tool)
#   make -j2 CUDA=0 build/zaya build/zaya_tests && ZAYA_DEVICE_DRY=1 tests/gpu/device-session.sh 120 tests,bench,experts,train,compile,profile
#       (the dry run: CPU binaries and a tiny model through every part; tests/cli/test_device_session.sh runs it too)
#   du -csh .devdeps .devbin .whl runs/demo/data/general runs/demo/data/mathcode runs/demo/tokenizer.json runs/demo/corpus/eval
#       (what travels: 64 MiB at most, the working tree included)
# Then carry those seven paths (without the runs/demo ones run.sh makes the demo data there, slower) and run
#   tests/gpu/device-session.sh [seconds] [parts]   (default 360 s, so a rerun fits; parts, comma-separated, default tests,bench:
#     tests    make test-gpu (tests/gpu/run.sh): alone, every second but 10; before other parts, 75% of the seconds
#              at most (it took 158 s on 2026-11-29 and has grown since: give it 420 s alone the first time)
#     bench    zaya bench gemm, then bench/vs_pytorch_gpu.py without torch.compile (training and decoding)
#     gemm     zaya bench gemm alone: the cuBLASLt peaks and a MoE layer's expert products at bench-gpu's and
#              ZAYA1-8B's widths (grouped wgmma + TMA, grouped WMMA async and staged, one cuBLASLt product per expert)
#     experts  bench train (bf16 AdamW, bench-gpu) with the grouped products' WMMA and wgmma forms
#              (ZAYA_GPU_EXPERT_KERNEL=async / sm90), alternating, two rounds
#     attention bench train (bf16 AdamW, bench-gpu) with the attention's two paths (ZAYA_GPU_ATTENTION=own / cudnn:
#              cuDNN's fused SDPA, from PyTorch's nvidia-cudnn-cu13 unless ZAYA_CUDNN_LIB says), alternating, two rounds
#     conv     bench train (bf16 AdamW, bench-gpu) with the CCA convolution's products in fp32 and on tensor cores
#              (ZAYA_GPU_CONV=fp32 / tc), alternating, two rounds; the attention phase's line (it holds the CCA)
#     window   bench train (bf16 AdamW) on configs/bench-gpu-sliding.json (bench-gpu with every other layer a 512-key
#              sliding window) with the windowed layers' attention on the fp32 kernels and on the tensor cores
#              (ZAYA_GPU_WINDOW_TC=off / on), alternating, two rounds; the attention phase's line
#     muon     bench train (bf16 Muon + AdamW, bench-gpu) with Newton–Schulz's symmetric products whole and in row
#              bands (ZAYA_GPU_NS_BANDS=off / on), alternating, two rounds; the optimizer phase's line
#     graphs   bench train (bf16 AdamW, bench-gpu) with each micro-batch's forward, loss and backward as launches and
#              as one CUDA graph (ZAYA_GPU_GRAPHS=0 / 1), alternating, two rounds; the same losses expected
#     train    the benchmark at ZAYA1-8B's real shapes (configs/bench-gpu-8b-slice.json), an optimizer step of >= 64K
#              tokens (--micro-batches 8 of 4 x 2048): bench/vs_pytorch_gpu.py, zaya AdamW and Muon + AdamW against
#              PyTorch eager on the same config, batch and accumulation
#     compile  PyTorch torch.compile training steps alone, in whatever time is left
#     slice    zaya bench train alone at ZAYA1-8B's real shapes (configs/bench-gpu-8b-slice.json), AdamW and
#              Muon + AdamW (ZAYA_DEVICE_SLICE_OPTIMIZERS="adamw" for one), an optimizer step of 8 x 4 x 2048 =
#              65,536 tokens (MFU at the real shapes)
#     decode   zaya bench decode on bench-gpu at batch 1 and 32, the KV cache in fp32 and in bf16, then through the
#              server's block pool with CUDA graphs (--path pool, ZAYA_GPU_GRAPHS=1); at batch 1 the few-row products
#              against cuBLASLt (ZAYA_GPU_FEW_ROWS=off / on, alternating, two rounds), programmatic dependent
#              launch off and on (ZAYA_GPU_PDL, the same way), and the layers as their launches or as one persistent
#              kernel a step (ZAYA_GPU_DECODE_LAYER=launches / persistent, the same way, without and with graphs)
#     decode8b ZAYA1-8B's schema (configs/zaya1-8b.json), random bf16 weights on both sides: zaya's decoding through
#              the block pool with CUDA graphs against transformers' generate, batch 1 and 32 (bench/vs_pytorch_gpu.py
#              --decode-only --decode-path pool); the weights read a step give the share of the bandwidth bound
#     serve    bench/serve_bench.py --device cuda on bench-gpu, bf16: zaya serve (and with ZAYA_GPU_GRAPHS=1) against
#              transformers' generate at 32 concurrent requests (tokens/s, TTFT and inter-token p50 / p99)
#     profile  per-kernel GPU times (ncu) of bf16 AdamW training steps on configs/bench-gpu.json cut to 2 layers:
#              every kernel's shape is bench-gpu's, a layer's kernels counted 9 times give the 18-layer step; totals
#              per step over every step the process ran, the cuBLASLt peak probe left out)
#              (ZAYA_DEVICE_PROFILE_CONFIG=configs/bench-gpu-8b-slice.json ZAYA_DEVICE_PROFILE_LAYERS=1: the real shapes)
#     pair     zaya bench train (bf16 AdamW, bench-gpu, 5 steps) then torch.compile's training steps on the same config,
#              batch and machine, side by side in one call (the compile worker gets what is left: the parts run in the
#              order listed here, so pair comes last)
# The environment passes through: ZAYA_GPU_SUITES picks tests/gpu/run.sh's suites, ZAYA_GPU_EXPERT_KERNEL the grouped
# products' form for everything but the experts part, ZAYA_GPU_ATTENTION the attention's path for everything but the
# attention part.
# Without .devbin (or if the carried binaries do not load there) it builds on the machine, for sm_90a alone.
# ZAYA_DEVICE_DRY=1: no GPU, nvidia-smi or ncu: build/'s CPU binaries on configs/tiny.json through the same commands,
# the GPU suites replaced by a unit-test subset, ncu by tests/gpu/fake_ncu.py, the PyTorch runs by a check of their
# options; it shows the archive it would return.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUDGET=${1:-360}
PARTS=",${2:-tests,bench},"
OUT=${OUT:-/tmp/zaya-gpu-out}
DRY=${ZAYA_DEVICE_DRY:-0}
mkdir -p "$OUT"
# The device returns at most 8 files: every log goes to $LOG and comes back packed as $OUT/gpu-session.tar.gz
# (re-packed after each part, so a run cut short still returns the parts it finished), next to $OUT/summary.txt
# (this script's output).
LOG=$(mktemp -d /tmp/zaya-gpu-session.XXXXXX)
ARCHIVE=$OUT/gpu-session.tar.gz
pack() { tar -czf "$ARCHIVE.part" -C "$LOG" . && mv -f "$ARCHIVE.part" "$ARCHIVE"; }
T0=$(date +%s)
elapsed() { echo $(($(date +%s) - T0)); }
stamp() { echo "[$(elapsed) s] $*"; }
left() { local l=$((BUDGET - $(elapsed))); [ "$l" -lt 10 ] && l=10; echo "$l"; }

# The shapes: bench-gpu's on the device; a tiny model on the CPU in a dry run, through the same commands
if [ "$DRY" = 1 ]; then
    # PROFILE_STEPS 2: the CPU's bench train runs 1 + 2 steps (no drained ones), a total no fixed divisor matches
    DEV=cpu CFG=configs/tiny.json BATCH=2 SEQ=32 GEMM_N=128 PROFILE_STEPS=2 SLICE=configs/tiny.json MICRO=2 CFG8B=configs/tiny.json
    WINDOW_CFG=configs/tiny-sliding.json
    NCU=tests/gpu/fake_ncu.py # runs the command and writes an ncu-shaped CSV (one 1 ms kernel per step it ran)
else
    DEV=cuda CFG=configs/bench-gpu.json BATCH=4 SEQ=2048 GEMM_N=8192 PROFILE_STEPS=1 WINDOW_CFG=configs/bench-gpu-sliding.json
    # the real shapes: an optimizer step of MICRO x BATCH x SEQ = 65,536 tokens
    SLICE=configs/bench-gpu-8b-slice.json MICRO=8 CFG8B=configs/zaya1-8b.json
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -n 1)
fi
# A Python benchmark: on the device it runs; in a dry run (no GPU for PyTorch) every --flag it is given must still be
# one the script defines, so a renamed option shows here rather than on the GPU.
py_bench() { # SCRIPT ARGS... (stdout and stderr as the caller redirects them)
    if [ "$DRY" = 1 ]; then
        local a missing=0
        for a in "${@:2}"; do
            [[ $a == --* ]] && ! grep -q -- "\"$a\"" "$1" && { echo "dry: $1 has no option $a"; missing=1; }
        done
        echo "dry: would run python3 $*"
        return $missing
    fi
    PYTHONUNBUFFERED=1 timeout "$(left)" python3 "$@"
}

# Two settings of one environment variable side by side, alternating, two rounds, on bench-gpu (bf16 AdamW): each
# run's step median and named lines, and the phase breakdown's line of that name. PART VAR 'LINES' MODE_A MODE_B
ab_rounds() { # part variable lines mode... (AB_OPTIMIZER: the optimizer, adamw unless set; AB_CONFIG: the model, $CFG unless set)
    local part=$1 var=$2 lines=$3 round mode f
    for round in 1 2; do
        for mode in "${@:4}"; do
            f="$LOG/$part-$mode-$round.txt"
            env "$var=$mode" timeout "$(left)" build/zaya bench train --config "${AB_CONFIG:-$CFG}" --device $DEV --precision bf16 \
                --optimizer "${AB_OPTIMIZER:-adamw}" --batch $BATCH --seq $SEQ --steps 3 --warmup 1 >"$f" 2>&1
            echo "$mode (round $round, exit $?): $(grep -E "^($lines) " "$f" | tr -s ' ' | tr '\n' ';')"
            grep -E "^ +$part " "$f"
        done
    done
    pack
}

session() {
    if [ "$DRY" = 1 ]; then
        echo "dry run (ZAYA_DEVICE_DRY=1): CPU binaries in build/, $CFG, no nvidia-smi, ncu or GPU tests"
    else
        [ -f .devdeps/use.sh ] && source .devdeps/use.sh
        if [ -d /opt/devdeps/usr/bin ]; then
            # Open MPI unpacked away from /usr: the alternatives links (mpirun, ...) are made by postinst scripts that
            # do not run there, and OPAL_PREFIX points it at its helpers and components
            for n in mpirun mpiexec mpicc; do [ -e /opt/devdeps/usr/bin/$n.openmpi ] && ln -sf $n.openmpi /opt/devdeps/usr/bin/$n; done
            export OPAL_PREFIX=/opt/devdeps/usr
        fi
        if ls .whl/*.whl >/dev/null 2>&1; then
            python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl &&
                export PYTHONPATH=/tmp/site
        fi
        # cuDNN for ZAYA_GPU_ATTENTION=cudnn: PyTorch's own copy (nvidia-cudnn-cu13), outside the loader's path
        if [ -z "${ZAYA_CUDNN_LIB:-}" ]; then
            lib=$(python3 -c 'import nvidia.cudnn as c, os; print(os.path.join(list(c.__path__)[0], "lib", "libcudnn.so.9"))' 2>/dev/null)
            [ -n "$lib" ] && [ -e "$lib" ] && export ZAYA_CUDNN_LIB=$lib
        fi
        echo "cuDNN for attention: ${ZAYA_CUDNN_LIB:-none found}"
        nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
        python3 -c 'import transformers, torch; print("transformers", transformers.__version__, "torch", torch.__version__)'

        mkdir -p build
        [ -x .devbin/zaya ] && cp .devbin/zaya .devbin/zaya_gpu_tests build/
        for b in zaya zaya_gpu_tests; do # gzipped (a third of the carry): unpacked here
            [ -s .devbin/$b.gz ] && gzip -dc .devbin/$b.gz >build/$b && chmod +x build/$b
        done
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
            make -j16 DNNL=0 CUDA_ARCH="-gencode arch=compute_90a,code=sm_90a" all >"$LOG/build.log" 2>&1 || {
                tail -n 40 "$LOG/build.log"
                return 1
            }
        fi
    fi
    build/zaya info
    if [[ $PARTS == *,tests,* ]]; then
        if [ "$DRY" = 1 ]; then
            # no GPU suites here: the unit test that loads the repository's configs stands in (the summary lines below
            # then have a suite line to show)
            stamp "dry: would run tests/gpu/run.sh; build/zaya_tests config_files_in_repo_load instead"
            OMP_NUM_THREADS=2 build/zaya_tests config_files_in_repo_load >"$LOG/test-gpu.log" 2>&1
        else
            stamp "make test-gpu (tests/gpu/run.sh)"
            TESTS_LIMIT=$(($(left) - 10))
            [ "$PARTS" != ",tests," ] && TESTS_LIMIT=$((BUDGET * 3 / 4))
            stamp "  at most $TESTS_LIMIT s"
            ZAYA_GPU_TEST_DIR=/tmp/gpu-test timeout "$TESTS_LIMIT" tests/gpu/run.sh >"$LOG/test-gpu.log" 2>&1
        fi
        echo "run.sh exit $?"
        grep -E '^(=== suite|zaya gpu tests|gpu tests:|[a-z-]+: [0-9]+ passed|  FAIL |FAIL |[0-9]+ passed, [0-9]+ failed)' "$LOG/test-gpu.log" |
            head -n 70
        # the worst gradients of the whole-model comparisons, and the oracle's per-config lines
        grep -E '^ +ok +model .*every gradient|^       .*rel err|^(ok  |FAIL) cfg' "$LOG/test-gpu.log" | cut -c1-180 | head -n 60
        pack
    fi
    if [[ $PARTS == *,bench,* ]]; then
        stamp "benchmarks"
        build/zaya bench gemm --device $DEV --n $GEMM_N >"$LOG/bench-gemm.txt" 2>&1
        tail -n 6 "$LOG/bench-gemm.txt"
        py_bench bench/vs_pytorch_gpu.py --config $CFG --batch $BATCH --seq $SEQ --steps 5 --no-compile \
            >"$LOG/vs-pytorch.txt" 2>&1
        echo "vs_pytorch_gpu exit $?"
        grep -v '^json' "$LOG/vs-pytorch.txt" | tail -n 45
        pack
    fi
    if [[ $PARTS == *,gemm,* ]]; then
        stamp "zaya bench gemm"
        timeout "$(left)" build/zaya bench gemm --device $DEV --n $GEMM_N >"$LOG/bench-gemm.txt" 2>&1
        echo "bench gemm exit $?"
        tail -n 6 "$LOG/bench-gemm.txt"
        pack
    fi
    if [[ $PARTS == *,experts,* ]]; then
        # the grouped products' WMMA (async) and wgmma + TMA (sm90) forms (gk_expert_kernel)
        stamp "experts: the grouped products async (WMMA) vs sm90 (wgmma + TMA)"
        ab_rounds experts ZAYA_GPU_EXPERT_KERNEL 'step|throughput|products' async sm90
    fi
    if [[ $PARTS == *,attention,* ]]; then
        # the attention's two paths (ZAYA_GPU_ATTENTION=own / cudnn)
        stamp "attention: zaya's kernels vs cuDNN's fused SDPA"
        ab_rounds attention ZAYA_GPU_ATTENTION 'step|throughput|losses' own cudnn
    fi
    if [[ $PARTS == *,conv,* ]]; then
        # the CCA convolution's products in bf16 runs: fp32 kernels vs tensor cores (ZAYA_GPU_CONV)
        stamp "conv: the CCA convolution's products fp32 vs tensor cores"
        ab_rounds attention ZAYA_GPU_CONV 'step|throughput|losses' fp32 tc
    fi
    if [[ $PARTS == *,window,* ]]; then
        # the sliding-window layers' attention in bf16 runs: fp32 kernels vs tensor cores (ZAYA_GPU_WINDOW_TC)
        stamp "window: $WINDOW_CFG's sliding-window layers' attention fp32 vs tensor cores"
        AB_CONFIG=$WINDOW_CFG ab_rounds attention ZAYA_GPU_WINDOW_TC 'model|step|throughput|losses' off on
    fi
    if [[ $PARTS == *,muon,* ]]; then
        # Newton–Schulz's symmetric products (X Xᵀ, A²) whole or in row bands of their upper triangle
        stamp "muon: Newton-Schulz's symmetric products whole vs in bands"
        AB_OPTIMIZER=muon ab_rounds optimizer ZAYA_GPU_NS_BANDS 'step|throughput|losses' off on
    fi
    if [[ $PARTS == *,graphs,* ]]; then
        # a training micro-batch's launches one by one or replayed as one CUDA graph (gpu_model_train_micro)
        stamp "graphs: the micro-batches as launches vs as one CUDA graph"
        ab_rounds graphs ZAYA_GPU_GRAPHS 'graphs|step|throughput|fwd\+bwd|losses' 0 1
    fi
    if [[ $PARTS == *,train,* ]]; then
        stamp "train: $SLICE, $MICRO micro-batches of $BATCH x $SEQ = $((MICRO * BATCH * SEQ)) tokens an optimizer step"
        if [ "$DRY" = 1 ]; then
            # vs_pytorch_gpu.py runs zaya bench train itself on the device; here the binary's side runs alone
            timeout "$(left)" build/zaya bench train --config $SLICE --device $DEV --precision bf16 --optimizer adamw \
                --batch $BATCH --seq $SEQ --micro-batches $MICRO --steps 2 --warmup 1 >"$LOG/train-8b-slice.txt" 2>&1
            echo "bench train exit $?: $(grep -E '^(batch|step|throughput) ' "$LOG/train-8b-slice.txt" | tr -s ' ' | tr '\n' ';')"
        fi
        py_bench bench/vs_pytorch_gpu.py --config $SLICE --batch $BATCH --seq $SEQ --micro-batches $MICRO --steps 3 \
            --no-compile --decode-batches "" >"$LOG/vs-pytorch-8b-slice.txt" 2>&1
        echo "vs_pytorch_gpu 8b-slice exit $?"
        grep -v '^json' "$LOG/vs-pytorch-8b-slice.txt" | grep -E '^(\||model|batch|step|throughput|MFU|peak|dry)' | tail -n 30
        pack
    fi
    if [[ $PARTS == *,compile,* ]]; then
        stamp "torch.compile training steps (bench/vs_pytorch_gpu.py's compile worker, $(left) s at most)"
        py_bench bench/vs_pytorch_gpu.py --worker compile --config $CFG --batch $BATCH --seq $SEQ --steps 5 \
            --compile-warmup 4 >"$LOG/compile.txt" 2>&1
        echo "torch.compile exit $? (124: still compiling when the time ran out)"
        tail -n 3 "$LOG/compile.txt"
        pack
    fi
    if [[ $PARTS == *,slice,* ]]; then
        stamp "slice: zaya alone on $SLICE, $MICRO micro-batches of $BATCH x $SEQ = $((MICRO * BATCH * SEQ)) tokens a step"
        for opt in ${ZAYA_DEVICE_SLICE_OPTIMIZERS:-adamw muon}; do
            timeout "$(left)" build/zaya bench train --config $SLICE --device $DEV --precision bf16 --optimizer $opt \
                --batch $BATCH --seq $SEQ --micro-batches $MICRO --steps 2 --warmup 1 >"$LOG/slice-$opt.txt" 2>&1
            echo "$opt (exit $?): $(grep -E '^(step|throughput|MFU|MFU cuBLAS|peak memory) ' "$LOG/slice-$opt.txt" | tr -s ' ' | tr '\n' ';')"
            grep -E '^ +(attention|router|experts|norms|head\+loss|optimizer|other) ' "$LOG/slice-$opt.txt"
            pack
        done
    fi
    if [[ $PARTS == *,decode,* ]]; then
        stamp "decode: $CFG, batch 1 and 32, KV cache fp32 and bf16"
        for b in 1 32; do
            for kv in f32 bf16; do
                timeout "$(left)" build/zaya bench decode --config $CFG --device $DEV --dtype bf16 --batch $b \
                    --kv-dtype $kv >"$LOG/decode-b$b-$kv.txt" 2>&1
                echo "batch $b, KV $kv (exit $?): $(grep -E '^(decode|weights|KV cache) ' "$LOG/decode-b$b-$kv.txt" | tr -s ' ' | tr '\n' ';' | cut -c1-330)"
            done
            # the server's block pool with its steps replayed as CUDA graphs (issue 31: batch 1 is launch-bound)
            if [ "$DEV" = cuda ]; then
                ZAYA_GPU_GRAPHS=1 timeout "$(left)" build/zaya bench decode --config $CFG --device $DEV --dtype bf16 \
                    --batch $b --kv-dtype bf16 --path pool >"$LOG/decode-b$b-pool-graphs.txt" 2>&1
                echo "batch $b, pool + graphs (exit $?): $(grep -E '^(path|kernels|decode|weights) ' "$LOG/decode-b$b-pool-graphs.txt" | tr -s ' ' | tr '\n' ';' | cut -c1-330)"
            fi
        done
        # decoding's few-row products (gpu_skinny.cu, steps of <= 8 rows) against cuBLASLt and the grouped experts
        if [ "$DEV" = cuda ]; then
            for fr in off on off on; do
                ZAYA_GPU_FEW_ROWS=$fr ZAYA_GPU_GRAPHS=1 timeout "$(left)" build/zaya bench decode --config $CFG \
                    --device $DEV --dtype bf16 --batch 1 --kv-dtype bf16 --path pool >"$LOG/decode-b1-few-$fr.txt" 2>&1
                echo "batch 1, pool + graphs, few-row products $fr (exit $?): $(grep -E '^decode ' "$LOG/decode-b1-few-$fr.txt" | tr -s ' ' | cut -c1-200)"
            done
            # programmatic dependent launch (ZAYA_GPU_PDL): the step's small kernels overlapping the one before
            for p in off on off on; do
                ZAYA_GPU_PDL=$p ZAYA_GPU_GRAPHS=1 timeout "$(left)" build/zaya bench decode --config $CFG --device $DEV \
                    --dtype bf16 --batch 1 --kv-dtype bf16 --path pool >"$LOG/decode-b1-pdl-$p.txt" 2>&1
                echo "batch 1, pool + graphs, programmatic launch $p (exit $?): $(grep -E '^(launches|kernels|decode) ' "$LOG/decode-b1-pdl-$p.txt" | tr -s ' ' | tr '\n' ';' | cut -c1-300)"
            done
            # a one-token step's layers as one persistent kernel (ZAYA_GPU_DECODE_LAYER), as launches and in graphs
            for pl in launches persistent launches persistent; do
                for g in 0 1; do
                    ZAYA_GPU_DECODE_LAYER=$pl ZAYA_GPU_GRAPHS=$g timeout "$(left)" build/zaya bench decode --config $CFG \
                        --device $DEV --dtype bf16 --batch 1 --kv-dtype bf16 --path pool >"$LOG/decode-b1-layer-$pl-g$g.txt" 2>&1
                    echo "batch 1, pool, graphs $g, layers as $pl (exit $?): $(grep -E '^(layers|barrier|kernels|decode) ' "$LOG/decode-b1-layer-$pl-g$g.txt" | tr -s ' ' | tr '\n' ';' | cut -c1-300)"
                done
            done
        fi
        pack
    fi
    if [[ $PARTS == *,decode8b,* ]]; then
        stamp "decode8b: $CFG8B (random bf16 weights), zaya's pool + graphs against transformers' generate"
        py_bench bench/vs_pytorch_gpu.py --config $CFG8B --decode-only --decode-path pool --decode-batches 1,32 \
            --decode-context 128 --decode-tokens 64 >"$LOG/decode-8b.txt" 2>&1
        echo "vs_pytorch_gpu decode 8b exit $?"
        grep -E '^(\||weights|decode|dry)' "$LOG/decode-8b.txt" | tail -n 12
        pack
    fi
    if [[ $PARTS == *,serve,* ]]; then
        stamp "serve: zaya serve --device $DEV against transformers, $CFG"
        py_bench bench/serve_bench.py --device $DEV --gpu-graphs --configs $CFG --dtypes bf16 --no-capacity \
            --threads 16 --concurrency 32 --requests 96 >"$LOG/serve.txt" 2>&1
        echo "serve_bench exit $?"
        grep -E '^(\||dry)' "$LOG/serve.txt" | tail -n 8
        pack
    fi
    if [[ $PARTS == *,profile,* ]]; then
        # ncu replays each kernel to time it alone (--clock-control none: the clocks a run gets): seconds per hundred
        # launches, so a 2-layer model (bench-gpu's shapes, 1/9 of its layers) and few steps. Kernel totals divide by
        # every step the process ran (bench train's "steps run": warm-up, timed and the phase breakdown's drained
        # steps), and --no-gemm-probe keeps the cuBLASLt peak probe's GEMMs out of the kernel rows.
        stamp "per-kernel times (ncu), $(left) s at most"
        [ -n "$NCU" ] || echo "profile: no ncu on PATH, in /opt/nvidia/nsight-compute or /usr/local/cuda/bin"
        # ZAYA_DEVICE_PROFILE_CONFIG / _LAYERS: another model (its layer_types cut to match), another depth
        python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); n = int(sys.argv[3]); c["num_hidden_layers"] = n
if isinstance(c.get("layer_types"), list): c["layer_types"] = c["layer_types"][:n]
json.dump(c, open(sys.argv[2], "w"))' \
            "${ZAYA_DEVICE_PROFILE_CONFIG:-$CFG}" "$LOG/profile-cut.json" "${ZAYA_DEVICE_PROFILE_LAYERS:-2}"
        timeout "$(left)" "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv --log-file "$LOG/ncu.csv" \
            build/zaya bench train --config "$LOG/profile-cut.json" --device $DEV --precision bf16 --optimizer adamw \
            --batch $BATCH --seq $SEQ --steps $PROFILE_STEPS --warmup 1 --no-gemm-probe >"$LOG/ncu-run.txt" 2>&1
        echo "ncu exit $?"
        local ran
        ran=$(sed -n 's/^steps run *\([0-9][0-9]*\).*/\1/p' "$LOG/ncu-run.txt")
        if [ -z "$ran" ]; then
            echo "profile: no \"steps run\" line in ncu-run.txt: per-kernel times left undivided"
            tail -n 5 "$LOG/ncu-run.txt"
        else
            python3 tests/gpu/kernel_times.py "$LOG/ncu.csv" --steps "$ran" >"$LOG/kernel-times.txt" 2>&1
            head -n 40 "$LOG/kernel-times.txt"
        fi
        pack
    fi
    if [[ $PARTS == *,pair,* ]]; then
        # zaya and torch.compile on the same config and batch, back to back on one machine
        stamp "pair: zaya bench train, then torch.compile, on $CFG"
        timeout "$(left)" build/zaya bench train --config $CFG --device $DEV --precision bf16 --optimizer adamw \
            --batch $BATCH --seq $SEQ --steps 5 --warmup 1 >"$LOG/pair-zaya.txt" 2>&1
        echo "zaya (exit $?): $(grep -E '^(step|throughput|MFU) ' "$LOG/pair-zaya.txt" | tr -s ' ' | tr '\n' ';')"
        grep -E '^ +(attention|router|experts|norms|head\+loss|optimizer|other) ' "$LOG/pair-zaya.txt"
        pack
        py_bench bench/vs_pytorch_gpu.py --worker compile --config $CFG --batch $BATCH --seq $SEQ --steps 5 \
            --compile-warmup 3 >"$LOG/pair-compile.txt" 2>&1
        echo "torch.compile exit $? (124: still compiling when the time ran out)"
        tail -n 1 "$LOG/pair-compile.txt" | cut -c1-300
        pack
    fi
    stamp "done"
}

session 2>&1 | tee "$LOG/summary.txt"
rc=${PIPESTATUS[0]}
cp "$LOG/summary.txt" "$OUT/summary.txt"
pack
echo "returned: $OUT/summary.txt and $ARCHIVE ($(du -k "$ARCHIVE" | cut -f1) KiB):"
tar -tzf "$ARCHIVE" | sed 's|^\./||; /^$/d; s/^/  /'
rm -rf "$LOG"
exit $rc
