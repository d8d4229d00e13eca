#!/usr/bin/env bash
# Chaos suite for `zaya supervise`: supervised 2-rank tiny training runs disturbed several times each at random
# (seeded, reproducible) steps — kill -9 of a random rank, SIGSTOP of a rank (a hang), an injected NaN
# (ZAYA_FAULT=nan@S:R), a flipped byte or a truncated file in the newest published checkpoint (then a rank is
# killed so the resume meets it). Checks per run:
#   - the supervised run finishes (exit 0, final/model.safetensors);
#   - its final weights are byte-identical (cmp) to an undisturbed run of the same config, given the same
#     --skip-data windows the supervisor recorded (none unless a NaN was injected);
#   - metrics.jsonl shows every step exactly once, in order.
# Prints a line per run and a final "chaos: N passed, N failed" with totals (disturbances by kind, runs finished,
# bit-identical, goodput).
#
# usage: tests/chaos/chaos.sh [--runs N] [--seed S] [--disturbances K] [--keep]
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../cli/fixture.sh"
cd "$(dirname "$0")/../.."
ZAYA=${ZAYA:-$PWD/build/zaya}
RUNS=10
SEED=1
PER_RUN=5
KEEP=0
while [ $# -gt 0 ]; do
    case $1 in
    --runs) RUNS=$2; shift 2 ;;
    --seed) SEED=$2; shift 2 ;;
    --disturbances) PER_RUN=$2; shift 2 ;;
    --keep) KEEP=1; shift ;;
    *) echo "usage: $0 [--runs N] [--seed S] [--disturbances K] [--keep]" >&2; exit 2 ;;
    esac
done
W=$(mktemp -d /tmp/zaya_chaos.XXXXXX)
[ "$KEEP" -eq 1 ] && echo "work directory: $W" || trap 'rm -rf "$W"' EXIT
suite_begin chaos
if ! command -v mpirun >/dev/null; then bad "mpirun not installed"; finish; fi
fixture_mpi_env
MPI="mpirun --oversubscribe -np 2"
STEPS=48

# ---- a tiny model, data and run config ----------------------------------------------------------------------
fixture_general_data "$W" 300 || { bad "data"; finish; }
fixture_model_json "$W/model.json" 300 64
# 48 steps of 16 sequences of 32 tokens; an asynchronous checkpoint every 4 steps, the newest 3 kept
cat >"$W/run.json" <<JSON
{"model": "$W/model.json", "datasets": {"general": "$W/data"},
 "phases": [{"name": "p", "tokens": $((STEPS * 16 * 32)), "seq_len": 32, "mixture": {"general": 1}}],
 "batch_size": 16, "micro_batch": 8, "optimizer": {"lr": 0.01, "weight_decay": 0.01},
 "checkpoint": {"interval": 4, "keep": 3, "async": true}, "seed": 7, "out_dir": "$W/unused"}
JSON

# Undisturbed reference runs, one per set of skip windows (cached by the windows).
reference() { # windows ("" or "A:B A:B ...") → prints the reference model path
    local key=${1:-none}
    key=${key// /_}
    local out="$W/ref_$key"
    if [ ! -s "$out/final/model.safetensors" ]; then
        local args=()
        for w in $1; do args+=(--skip-data "$w"); done
        $MPI $ZAYA train "$W/run.json" --override out_dir="$out" "${args[@]}" --quiet >"$out.log" 2>&1 ||
            { echo "reference run failed: $(tail -3 "$out.log")" >&2; return 1; }
    fi
    echo "$out/final/model.safetensors"
}
reference "" >/dev/null || { bad "undisturbed reference run"; finish; }

# "STEP PID0 PID1" once both ranks' heartbeats say "running" (STEP: the lower of their steps), else empty.
# Plain bash (no process per poll), so a disturbance lands close to its planned step.
heartbeat_state() {
    local line step pids=() min=""
    for r in 0 1; do
        line=""
        { read -r line <"$1/heartbeat/rank-0000$r.json"; } 2>/dev/null || return 0
        [[ $line =~ \"pid\":\ ([0-9]+).*\"step\":\ ([0-9]+).*\"state\":\ \"running\" ]] || return 0
        pids+=("${BASH_REMATCH[1]}")
        step=${BASH_REMATCH[2]}
        if [ -z "$min" ] || [ "$step" -lt "$min" ]; then min=$step; fi
    done
    echo "$min ${pids[0]} ${pids[1]}"
}

declare -A injected=([kill]=0 [hang]=0 [nan]=0 [corrupt]=0 [truncate]=0)
declare -A detected=([crash]=0 [hang]=0 [nonfinite]=0 [spike]=0 [bad_checkpoint]=0)
restarts_total=0
redone_total=0
runs_finished=0
runs_identical=0
goodput_sum=0
KINDS=(kill hang nan corrupt truncate)
for run in $(seq 1 "$RUNS"); do
    RANDOM=$((SEED * 1000 + run)) # bash's RNG: the same seed gives the same disturbances
    out="$W/run$run"
    # K disturbances at distinct steps 3 apart or more, in [6, STEPS-4] (after the first checkpoint); kinds in a
    # random order, every kind once in a run of 5
    steps=()
    kinds=()
    candidates=($(seq 6 3 $((STEPS - 4))))
    for i in $(seq 0 $((PER_RUN - 1))); do
        j=$((RANDOM % ${#candidates[@]}))
        steps+=("${candidates[$j]}")
        candidates=("${candidates[@]:0:$j}" "${candidates[@]:$((j + 1))}")
    done
    IFS=$'\n' steps=($(sort -n <<<"${steps[*]}"))
    unset IFS
    shuffled=("${KINDS[@]}")
    for i in $(seq $((${#shuffled[@]} - 1)) -1 1); do
        j=$((RANDOM % (i + 1)))
        tmp=${shuffled[$i]}
        shuffled[$i]=${shuffled[$j]}
        shuffled[$j]=$tmp
    done
    for i in $(seq 0 $((PER_RUN - 1))); do kinds+=("${shuffled[$((i % ${#shuffled[@]}))]}"); done
    fault_env=""
    plan=""
    for i in "${!steps[@]}"; do
        plan+="${kinds[$i]}@${steps[$i]} "
        if [ "${kinds[$i]}" = nan ]; then fault_env+="${fault_env:+,}nan@${steps[$i]}:$((RANDOM % 2))"; fi
    done
    ZAYA_FAULT=$fault_env $ZAYA supervise --hang-timeout 3 --start-timeout 60 --grace 2 --backoff 0.2 --backoff-max 1 \
        --max-restarts 12 --poll 0.1 -- $MPI $ZAYA train "$W/run.json" --override out_dir="$out" --quiet \
        >"$out.log" 2>&1 &
    sup=$!
    applied=""
    for i in "${!steps[@]}"; do
        kind=${kinds[$i]} target=${steps[$i]}
        [ "$kind" = nan ] && continue # injected by the trainer itself (ZAYA_FAULT); counted below if it fired
        # wait until both ranks run at or past the target step
        state=""
        for _ in $(seq 1 6000); do
            kill -0 $sup 2>/dev/null || break
            state=$(heartbeat_state "$out")
            if [ -n "$state" ] && [ "${state%% *}" -ge "$target" ]; then break; fi
            state=""
            sleep 0.02
        done
        [ -n "$state" ] || continue # the run ended first: not injected
        read -r at pid0 pid1 <<<"$state"
        pids=($pid0 $pid1)
        victim=${pids[$((RANDOM % 2))]}
        case $kind in
        kill) kill -9 "$victim" 2>/dev/null ;;
        hang) kill -STOP "$victim" 2>/dev/null ;;
        corrupt | truncate)
            # freeze the job so it publishes nothing newer, damage the newest checkpoint, then kill a rank
            kill -STOP "$pid0" "$pid1" 2>/dev/null
            latest=$(cat "$out/checkpoints/latest" 2>/dev/null)
            ck="$out/checkpoints/$latest"
            if [ -z "$latest" ] || [ ! -d "$ck" ]; then
                kind=kill # nothing published yet (everything was quarantined): only the kill happens
            else
                if [ "$kind" = corrupt ]; then
                    f="$ck/model.safetensors"
                    size=$(stat -c %s "$f")
                    off=$(((RANDOM * 32768 + RANDOM) % (size - 8) + 8))
                    byte=$(od -An -tu1 -j "$off" -N1 "$f" | tr -d ' ')
                    printf "\\$(printf %03o $(((byte ^ 0xff) & 0xff)))" | dd of="$f" bs=1 seek="$off" conv=notrunc status=none
                else
                    files=("$ck"/model.safetensors "$ck"/optimizer-*.safetensors "$ck"/trainer_state.json)
                    f=${files[$((RANDOM % ${#files[@]}))]}
                    truncate -s $(($(stat -c %s "$f") / 2)) "$f"
                fi
            fi
            kill -9 "$victim" 2>/dev/null
            kill -CONT "$pid0" "$pid1" 2>/dev/null
            ;;
        esac
        applied+="$kind@$at "
        injected[$kind]=$((injected[$kind] + 1))
    done
    wait $sup
    rc=$?
    for marker in "$out"/faults-fired/nan@*; do
        [ -e "$marker" ] || continue
        m=${marker##*/}
        applied+="${m%%:*} "
        injected[nan]=$((injected[nan] + 1))
    done
    problems=""
    if [ $rc -eq 0 ] && [ -s "$out/final/model.safetensors" ]; then
        runs_finished=$((runs_finished + 1))
    else
        problems+="supervisor exit $rc; "
    fi
    # the skip windows the supervisor recorded (faults.jsonl) and the trainer kept (final trainer state)
    windows=$(python3 - "$out" <<'PY'
import json, sys
ws = []
for line in open(sys.argv[1] + "/faults.jsonl"):
    e = json.loads(line)
    if "skip" in e:
        ws.append((int(e["skip"][0]), int(e["skip"][1])))
print(" ".join(f"{a}:{b}" for a, b in sorted(ws)))
PY
)
    state_windows=$(python3 - "$out" <<'PY' 2>/dev/null
import json, sys
root = sys.argv[1] + "/checkpoints/"
st = json.load(open(root + open(root + "latest").read().strip() + "/trainer_state.json"))
print(" ".join(f"{int(a)}:{int(b)}" for a, b in st.get("skip_windows", [])))
PY
)
    [ "$windows" = "$state_windows" ] || problems+="skip windows in faults.jsonl ($windows) and trainer state ($state_windows) differ; "
    ref=$(reference "$state_windows")
    if [ -n "$ref" ] && cmp -s "$ref" "$out/final/model.safetensors"; then
        runs_identical=$((runs_identical + 1))
        identical=yes
    else
        identical=NO
        problems+="final weights differ from the undisturbed run; "
    fi
    steps_ok=$(python3 - "$out" "$STEPS" <<'PY' 2>/dev/null
import json, sys
steps = [json.loads(l)["step"] for l in open(sys.argv[1] + "/metrics.jsonl") if '"kind":"train"' in l]
print("yes" if steps == list(range(1, int(sys.argv[2]) + 1)) else f"NO ({len(steps)} lines)")
PY
)
    [ "$steps_ok" = yes ] || problems+="metrics steps: $steps_ok; "
    read -r goodput restarts redone faults < <(python3 - "$out" <<'PY' 2>/dev/null
import json, sys
s = json.load(open(sys.argv[1] + "/supervisor_summary.json"))
f = s["faults"]
print(f"{s['goodput']:.3f}", s["restarts"], s["steps_redone"], ",".join(f"{k}={v}" for k, v in f.items() if v))
PY
)
    restarts_total=$((restarts_total + ${restarts:-0}))
    redone_total=$((redone_total + ${redone:-0}))
    for kv in ${faults//,/ }; do detected[${kv%%=*}]=$((detected[${kv%%=*}] + ${kv#*=})); done
    goodput_sum=$(python3 -c "print(${goodput_sum} + ${goodput:-0})")
    detail="plan ${plan% }; applied ${applied% }; detected ${faults:-none}; restarts ${restarts:-?}; skip [${windows}]; bit-identical $identical; goodput ${goodput:-?}"
    if [ -z "$problems" ]; then
        echo "ok   run $run: $detail"
        pass=$((pass + 1))
    else
        echo "FAIL run $run: $detail: $problems(log: $out.log)"
        fail=$((fail + 1))
        [ "$KEEP" -eq 1 ] || tail -20 "$out.log"
    fi
done
total=$((injected[kill] + injected[hang] + injected[nan] + injected[corrupt] + injected[truncate]))
echo "disturbances injected: $total (kill -9 ${injected[kill]}, SIGSTOP ${injected[hang]}, NaN ${injected[nan]}," \
    "flipped byte ${injected[corrupt]}, truncated file ${injected[truncate]})"
echo "detected by the supervisor: crash ${detected[crash]}, hang ${detected[hang]}, nonfinite ${detected[nonfinite]}," \
    "bad checkpoint ${detected[bad_checkpoint]}; restarts $restarts_total; steps redone $redone_total"
echo "runs finished: $runs_finished/$RUNS; bit-identical to the undisturbed run: $runs_identical/$RUNS;" \
    "mean goodput $(python3 -c "print(f'{${goodput_sum} / max(1, $RUNS):.3f}')")"
finish
