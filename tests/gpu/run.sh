#!/usr/bin/env bash
# make test-gpu: the GPU suites, on a machine with an NVIDIA GPU. Each suite prints "<suite>: N passed, N failed";
# the closing line sums them ("N passed, N failed").
#   kernels+model  build/zaya_gpu_tests: every gk_ kernel and cuBLASLt product vs its CPU namesake, the whole model
#                  (fp32) vs the CPU path on ZAYA1 and every research variant, cached decoding (same-length cache and
#                  the ragged block pool) vs the CPU's
#   training       50 bf16 steps of the demo model on the GPU tracking the CPU's loss curve; a GPU checkpoint resumed
#                  on the CPU and a CPU checkpoint on the GPU; an interrupted GPU run resumed bit for bit; generate
#                  and serve --device cuda on the trained model (tests/gpu/serve_check.py)
#   oracle         zaya forward --device cuda against transformers' ZayaForCausalLM (tests/oracle/test_oracle.py)
#   ranks          zaya bench comm --backend nccl with one rank (0 wrong elements); mpirun -np 2 on one shared GPU
#                  (host-staged exchange) tracking the 1-rank GPU curve, stopped and resumed on 1 rank (reshaped
#                  checkpoint); ZAYA_NCCL=1 on a shared GPU is a clear error; with 2+ GPUs, NCCL training runs
#   sanitizer      compute-sanitizer memcheck over a short GPU training run (when compute-sanitizer is installed)
set -uo pipefail
cd "$(dirname "$0")/../.."
Z=build/zaya
W=${ZAYA_GPU_TEST_DIR:-build/gpu-test}
mkdir -p "$W"
total_pass=0
total_fail=0
suite_line() { # name pass fail
    echo "$1: $2 passed, $3 failed"
    total_pass=$((total_pass + $2))
    total_fail=$((total_fail + $3))
}

# ZAYA_GPU_SUITES (comma-separated, default all): the suites to run, e.g. to fit a short GPU window
want() { [[ ",${ZAYA_GPU_SUITES:-kernels,training,oracle,ranks,sanitizer}," == *,$1,* ]] || { echo "=== suite: gpu $1: skipped (ZAYA_GPU_SUITES)"; false; }; }
if want kernels; then
    echo "=== suite: gpu kernels + model"
    build/zaya_gpu_tests 2>&1 | tee "$W/kernels.log"
    rc=${PIPESTATUS[0]}
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$W/kernels.log" | tail -n 1)
    if [ -z "$line" ]; then suite_line gpu-kernels 0 1; else
        p=${line%% passed*}; f=${line#*, }; f=${f%% failed*}
        [ "$rc" -ne 0 ] && [ "$f" -eq 0 ] && f=1
        suite_line gpu-kernels "$p" "$f"
    fi
fi

if want training; then
    echo "=== suite: gpu training"
    pass=0
    fail=0
    check() { # name command...
        local name=$1
        shift
        if "$@" >"$W/check.log" 2>&1; then
            echo "  ok   $name"
            case "$1" in python3) sed 's/^/       /' "$W/check.log" | tail -n 1 ;; esac
            pass=$((pass + 1))
        else
            echo "  FAIL $name"; sed 's/^/       /' "$W/check.log" | tail -n 20; fail=$((fail + 1)); fi
    }
    [ -s runs/demo/data/mathcode/meta.json ] && [ -s runs/demo/tokenizer.json ] && [ -s runs/demo/corpus/eval/arith_mc.jsonl ] ||
        scripts/demo-data.sh >"$W/demo-data.log" 2>&1
    # 50 steps of the demo model, one phase, bf16 products; checkpoints every 25 steps
    cat >"$W/run.json" <<'JSON'
{
  "model": "configs/demo-model.json",
  "datasets": {"general": "runs/demo/data/general", "mathcode": "runs/demo/data/mathcode"},
  "phases": [{"name": "web", "tokens": 102400, "seq_len": 128, "mixture": {"general": 0.5, "mathcode": 0.5}}],
  "batch_size": 16, "micro_batch": 8,
  "optimizer": {"lr": 0.01, "weight_decay": 0.01, "grad_clip": 1.0},
  "schedule": {"warmup_steps": 5},
  "checkpoint": {"interval": 25, "keep": 4, "async": false},
  "log_interval": 1, "seed": 7, "precision": "bf16", "out_dir": "OUT"
}
JSON
    train() { # out_dir device extra...
        local out=$1 dev=$2
        shift 2
        $Z train "$W/run.json" --quiet --override "out_dir=$out" --device "$dev" "$@"
    }
    rm -rf "$W"/cpu "$W"/gpu "$W"/gpu-resume "$W"/gpu-graphs "$W"/gpu-to-cpu "$W"/cpu-to-gpu
    check "50 bf16 steps on the CPU" train "$W/cpu" cpu
    check "50 bf16 steps on the GPU" train "$W/gpu" cuda
    check "GPU loss curve tracks the CPU's (50 steps)" python3 tests/gpu/compare_runs.py curve "$W/cpu" "$W/gpu"
    # an interrupted GPU run resumed on the GPU: bit-identical to the straight run
    check "GPU run stopped at step 25" train "$W/gpu-resume" cuda --stop-after 25
    check "GPU run resumed to step 50" train "$W/gpu-resume" cuda --resume
    check "GPU resume is bit-identical (metrics and final weights)" python3 tests/gpu/compare_runs.py identical "$W/gpu" "$W/gpu-resume"
    # each micro-batch's forward, loss and backward as one CUDA graph: the launches' run bit for bit
    check "50 bf16 steps with the micro-batches as CUDA graphs (ZAYA_GPU_GRAPHS=1)" \
        env ZAYA_GPU_GRAPHS=1 $Z train "$W/run.json" --quiet --override "out_dir=$W/gpu-graphs" --device cuda
    check "graphs give the launches' run bit for bit (metrics and final weights)" \
        python3 tests/gpu/compare_runs.py identical "$W/gpu" "$W/gpu-graphs"
    # a GPU checkpoint resumed on the CPU, and a CPU checkpoint on the GPU
    check "GPU run to step 25, resumed on the CPU" bash -c "$(declare -f train); Z=$Z W=$W; train $W/gpu-to-cpu cuda --stop-after 25 && train $W/gpu-to-cpu cpu --resume"
    check "CPU run to step 25, resumed on the GPU" bash -c "$(declare -f train); Z=$Z W=$W; train $W/cpu-to-gpu cpu --stop-after 25 && train $W/cpu-to-gpu cuda --resume"
    check "GPU→CPU run tracks the CPU's curve" python3 tests/gpu/compare_runs.py curve "$W/cpu" "$W/gpu-to-cpu"
    check "CPU→GPU run tracks the CPU's curve" python3 tests/gpu/compare_runs.py curve "$W/cpu" "$W/cpu-to-gpu"
    check "first 25 steps of GPU→CPU equal the GPU run's" python3 tests/gpu/compare_runs.py prefix "$W/gpu" "$W/gpu-to-cpu" 25
    # cached decoding on the GPU: greedy generation from the trained model gives the CPU's tokens
    gen() { $Z generate --model "$W/cpu/final" --ids --prompt "2 17 5 9" --max-tokens 40 --temperature 0 "$@"; }
    gen_same() { # both must run and print tokens (two failures would print two equal empty strings)
        local a b
        a=$(gen) && b=$(gen --device cuda) && [ -n "$a" ] && [ "$a" = "$b" ] || { echo "cpu: $a"; echo "gpu: $b"; return 1; }
    }
    check "generate --device cuda: the CPU's 40 greedy tokens" gen_same
    # serving on the GPU: greedy completions over HTTP, one at a time and six at once (ragged steps over the GPU's KV
    # block pool), equal generate --device cuda's text; fp32 and bf16 products
    check "serve --device cuda: completions equal generate --device cuda's (f32)" python3 tests/gpu/serve_check.py \
        $Z "$W/cpu/final" runs/demo/tokenizer.json --dtype f32
    check "serve --device cuda --dtype bf16: completions equal generate --device cuda's" python3 tests/gpu/serve_check.py \
        $Z "$W/cpu/final" runs/demo/tokenizer.json --dtype bf16
    # a bf16 folder: both commands upload its matrices from the mapped files (no fp32 host copy, gpu_weight_upload.c)
    check "zaya convert the trained model to bf16" $Z convert --model "$W/cpu/final" --out "$W/final-bf16" --dtype bf16
    check "serve/generate --device cuda on a bf16 folder (mapped upload): equal completions" python3 tests/gpu/serve_check.py \
        $Z "$W/final-bf16" runs/demo/tokenizer.json --dtype auto
    check "serve/generate --device cuda --kv-dtype bf16 (bf16 KV cache and pool): equal completions" \
        python3 tests/gpu/serve_check.py $Z "$W/final-bf16" runs/demo/tokenizer.json --dtype auto --kv-dtype bf16
    check "serve --device cuda with ZAYA_GPU_GRAPHS=1 (steps replayed as CUDA graphs): generate's completions" \
        env ZAYA_GPU_GRAPHS=1 python3 tests/gpu/serve_check.py $Z "$W/final-bf16" runs/demo/tokenizer.json --dtype auto
    # eval on the GPU: multiple choice, exact match and the held-out loss with routing, against the CPU's
    ev() { # json extra...
        $Z eval --model "$W/cpu/final" --tokenizer runs/demo/tokenizer.json --task runs/demo/corpus/eval/arith_mc.jsonl \
            runs/demo/corpus/eval/addition2.jsonl --limit 30 --shards runs/demo/data/mathcode --max-tokens 2048 \
            --seq-len 128 --json "$@"
    }
    check "eval --device cuda: the CPU's accuracies, held-out loss and routing" bash -c \
        "$(declare -f ev); Z=$Z W=$W; ev $W/eval-cpu.json && ev $W/eval-gpu.json --device cuda && python3 tests/gpu/compare_runs.py eval $W/eval-cpu.json $W/eval-gpu.json"
    suite_line gpu-training "$pass" "$fail"
fi

if want oracle; then
    echo "=== suite: gpu oracle (zaya forward --device cuda vs transformers' ZayaForCausalLM)"
    if python3 -c "from transformers import ZayaForCausalLM" >/dev/null 2>&1; then
        ZAYA_ORACLE_DEVICE=cuda ZAYA_BIN=tests/gpu/zaya_on_gpu.sh python3 tests/oracle/test_oracle.py 2>&1 |
            tee "$W/oracle.log"
        line=$(grep -E '^[a-z_-]+: [0-9]+ passed, [0-9]+ failed' "$W/oracle.log" | tail -n 1)
        if [ -z "$line" ]; then suite_line gpu-oracle 0 1; else
            p=$(echo "$line" | sed -E 's/.*: ([0-9]+) passed.*/\1/'); f=$(echo "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/')
            suite_line gpu-oracle "$p" "$f"
        fi
    else
        echo "gpu-oracle: skipped (transformers with ZayaForCausalLM not importable: make deps, or carry a wheel)"
    fi
fi

if want ranks; then
    echo "=== suite: gpu ranks (NCCL bench, host-staged 2-rank training on one GPU, reshaped resume, ZAYA_NCCL)"
    pass=0
    fail=0
    # (a) NCCL with one rank: every collective on device buffers, float and bf16, 0 wrong elements
    bench_nccl() { # dtype json
        $Z bench comm --backend nccl -b 8 -e 64M -n 5 -w 1 -c 1 -d "$1" --json "$2" >"$2.txt" || return 1
        grep -q '^# Out of bounds values : 0 OK$' "$2.txt" || return 1
        [ "$(grep -c '^# [a-z_]* (busbw factor' "$2.txt")" -eq 5 ] || return 1
        # every row: 13 columns, #wrong 0 out-of-place and in-place
        [ "$(grep -v '^#' "$2.txt" | awk 'NF != 13 || $9 != 0 || $13 != 0' | wc -l)" -eq 0 ] || return 1
        python3 -c 'import json, sys; j = json.load(open(sys.argv[1])); assert j["backend"] == "nccl" and j["nranks"] == 1 and j["wrong_total"] == 0 and len(j["rows"]) == 5 * 24, j["backend"]' "$2"
    }
    check "bench comm --backend nccl, 1 rank, float: 5 collectives, 0 wrong" bench_nccl float "$W/nccl-float.json"
    check "bench comm --backend nccl, 1 rank, bf16: 5 collectives, 0 wrong" bench_nccl bf16 "$W/nccl-bf16.json"
    [ -s "$W/nccl-float.json.txt" ] && sed -n '1,3p' "$W/nccl-float.json.txt" | sed 's/^/       /'
    if command -v mpirun >/dev/null 2>&1; then
        # tests/cli/fixture.sh's fixture_mpi_env (Open MPI as root, shared memory), two OpenMP threads per rank
        # (locally launched ranks inherit the environment; -x names what a rank must see)
        MPIRUN=(env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader OMP_NUM_THREADS=2
                timeout 1800 mpirun --oversubscribe --mca plm_rsh_agent "")
        # (b) two ranks on one GPU (ZAYA_GPU=0 shares it even on a machine with more): NCCL cannot pair them, so the
        # exchange is host-staged; the same global batch as the 1-rank GPU run, so the loss curves agree
        rm -rf "$W"/np2 "$W"/np2-to-1 "$W"/nccl-forced
        export ZAYA_GPU=0
        unset ZAYA_NCCL
        check "2 ranks sharing one GPU: 50 bf16 steps" "${MPIRUN[@]}" -x ZAYA_GPU -np 2 $Z train "$W/run.json" --quiet \
            --override "out_dir=$W/np2" --device cuda
        check "2 ranks sharing one GPU: the host-staged path was chosen (events.log)" \
            grep -q 'collectives: host-staged through MPI (ranks 0 and 1 share one GPU)' "$W/np2/events.log"
        check "2-rank GPU loss curve tracks the 1-rank GPU run's" python3 tests/gpu/compare_runs.py curve "$W/gpu" "$W/np2"
        # reshaped: 2 ranks to step 25 (two optimizer shards), resumed by 1 rank to step 50
        check "2 ranks stopped at step 25" "${MPIRUN[@]}" -x ZAYA_GPU -np 2 $Z train "$W/run.json" --quiet \
            --override "out_dir=$W/np2-to-1" --device cuda --stop-after 25
        check "the 2-rank checkpoint has 2 optimizer shards" \
            test "$(ls "$W/np2-to-1/checkpoints/step-00000025" | grep -c '^optimizer-0000[01]-of-00002')" -eq 2
        check "resumed on 1 rank (GPU) to step 50" train "$W/np2-to-1" cuda --resume
        check "first 25 steps of 2→1 equal the 2-rank run's (bit for bit)" \
            python3 tests/gpu/compare_runs.py prefix "$W/np2" "$W/np2-to-1" 25
        check "2→1-rank run tracks the 1-rank GPU run's curve" python3 tests/gpu/compare_runs.py curve "$W/gpu" "$W/np2-to-1"
        # (c) ZAYA_NCCL=1 demands NCCL: on a shared GPU that is a clear error on start-up (no fallback), exit non-zero
        nccl_forced() {
            ZAYA_NCCL=1 "${MPIRUN[@]}" -x ZAYA_GPU -x ZAYA_NCCL -np 2 $Z train "$W/run.json" --quiet --override "out_dir=$W/nccl-forced" \
                --device cuda >"$W/nccl-forced.log" 2>&1
            local rc=$?
            cat "$W/nccl-forced.log"
            [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && grep -q 'ZAYA_NCCL=1: ranks 0 and 1 share one GPU' "$W/nccl-forced.log" &&
                [ ! -e "$W/nccl-forced/checkpoints" ]
        }
        check "ZAYA_NCCL=1 with 2 ranks on one GPU: a clear error, no training" nccl_forced
        unset ZAYA_GPU
        # with 2+ GPUs: each rank its own GPU, so NCCL carries the exchange
        gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
        if [ "${gpus:-0}" -ge 2 ]; then
            rm -rf "$W"/nccl2
            nccl_bench2() {
                "${MPIRUN[@]}" -np 2 $Z bench comm --backend nccl -b 8 -e 64M -n 5 -w 1 -c 1 >"$W/nccl2-bench.txt" &&
                    grep -q '^# Out of bounds values : 0 OK$' "$W/nccl2-bench.txt"
            }
            check "bench comm --backend nccl, 2 ranks on 2 GPUs: 0 wrong" nccl_bench2
            check "2 ranks on 2 GPUs (NCCL): 50 bf16 steps" "${MPIRUN[@]}" -np 2 $Z train "$W/run.json" --quiet \
                --override "out_dir=$W/nccl2" --device cuda
            check "2 ranks on 2 GPUs: NCCL was chosen (events.log)" grep -q 'collectives: NCCL' "$W/nccl2/events.log"
            check "NCCL 2-rank curve tracks the 1-rank GPU run's" python3 tests/gpu/compare_runs.py curve "$W/gpu" "$W/nccl2"
            # 2 ranks: a + b is exact in either order, so NCCL and MPI sum the same bits
            check "NCCL 2-rank run equals the host-staged 2-rank run (bit for bit)" \
                python3 tests/gpu/compare_runs.py identical "$W/np2" "$W/nccl2"
        else
            echo "  (one GPU: the NCCL training checks need 2+ GPUs, skipped)"
        fi
    else
        echo "  (mpirun not installed: the multi-rank checks are skipped; make deps installs Open MPI)"
    fi
    suite_line gpu-ranks "$pass" "$fail"
fi

if want sanitizer; then
    if command -v compute-sanitizer >/dev/null 2>&1; then
        echo "=== suite: gpu sanitizer"
        pass=0
        fail=0
        rm -rf "$W/sanitize"
        check "compute-sanitizer memcheck: 3 GPU training steps, 0 errors" bash -c \
            "compute-sanitizer --tool memcheck --error-exitcode 9 $Z train $W/run.json --quiet --override out_dir=$W/sanitize \
             --override phases.0.tokens=6144 --device cuda"
        suite_line gpu-sanitizer "$pass" "$fail"
    else
        echo "gpu-sanitizer: skipped (compute-sanitizer not installed)"
    fi
fi

echo
echo "${total_pass} passed, ${total_fail} failed"
[ "$total_fail" -eq 0 ]
