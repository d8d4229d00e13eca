#!/usr/bin/env bash
# zaya supervise, one behaviour at a time, on a single-process tiny run (ZAYA_FAULT injects the failures):
# crash → restart, hang → restart, non-finite step and loss spikes → roll back and skip (same weights as
# `train --skip-data`),
# a corrupt checkpoint met at resume → quarantined, give-up after --max-restarts, preemption (SIGTERM to the
# supervisor → exit 0 with a checkpoint; the resumed run ends bit-identical), bad flags → clear errors; and the
# trainer's own --resume fallback / --resume-from checks.
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/fixture.sh"
cd "$(dirname "$0")/../.."
ZAYA=${ZAYA:-$PWD/build/zaya}
W=$(mktemp -d /tmp/zaya_supervise_test.XXXXXX)
trap 'rm -rf "$W"' EXIT
suite_begin supervise
fixture_mpi_env

fixture_general_data "$W" 300 || { bad "data"; finish; }
fixture_model_json "$W/model.json" 300 64
# 16 steps; a synchronous checkpoint every 2 steps (so a corrupt@S fault lands before the next step)
cat >"$W/run.json" <<JSON
{"model": "$W/model.json", "datasets": {"general": "$W/data"},
 "phases": [{"name": "p", "tokens": 4096, "seq_len": 16, "mixture": {"general": 1}}],
 "batch_size": 16, "micro_batch": 16, "optimizer": {"lr": 0.01},
 "checkpoint": {"interval": 2, "keep": 3, "async": false}, "seed": 5, "out_dir": "$W/straight"}
JSON
SUP="$ZAYA supervise --hang-timeout 2 --start-timeout 60 --grace 1 --backoff 0.1 --backoff-max 0.5 --poll 0.05"
$ZAYA train "$W/run.json" --quiet >"$W/straight.log" 2>&1 || { bad "straight run: $(tail -3 "$W/straight.log")"; finish; }
REF="$W/straight/final/model.safetensors"
events() { python3 -c "import json,sys; print(' '.join(json.loads(l)['kind'] for l in open(sys.argv[1])))" "$1/faults.jsonl" 2>/dev/null; }
steps_once() {
    python3 -c "import json,sys; s=[json.loads(l)['step'] for l in open(sys.argv[1]) if '\"kind\":\"train\"' in l]; sys.exit(s != list(range(1, 17)))" \
        "$1/metrics.jsonl"
}

# ---- crash → restart (run directory read from the command's --override out_dir) ----
out="$W/crash"
ZAYA_FAULT=crash@5 $SUP -- $ZAYA train "$W/run.json" --override out_dir="$out" --quiet >"$out.log" 2>&1
rc=$?
check "crash: supervisor exit 0" test $rc -eq 0
check "crash: faults.jsonl = crash restart done ($(events "$out"))" test "$(events "$out")" = "crash restart done"
check "crash: resumed from step 4, final weights byte-identical" cmp -s "$REF" "$out/final/model.safetensors"
check "crash: metrics show every step once" steps_once "$out"
check "crash: summary counts 1 restart, 1 step redone" python3 -c "
import json, sys; s = json.load(open('$out/supervisor_summary.json'))
sys.exit(not (s['restarts'] == 1 and s['faults']['crash'] == 1 and s['steps_redone'] == 1 and 0 < s['goodput'] <= 1))"

# ---- hang → restart ----
out="$W/hang"
t0=$(date +%s)
ZAYA_FAULT=hang@7 $SUP -- $ZAYA train "$W/run.json" --override out_dir="$out" --quiet >"$out.log" 2>&1
rc=$?
check "hang: supervisor exit 0 within 60 s ($(($(date +%s) - t0)) s)" test $rc -eq 0 -a $(($(date +%s) - t0)) -lt 60
check "hang: faults.jsonl = hang restart done ($(events "$out"))" test "$(events "$out")" = "hang restart done"
check "hang: final weights byte-identical" cmp -s "$REF" "$out/final/model.safetensors"
check "hang: the hung process is gone" test -z "$(pgrep -f "out_dir=$out" | grep -v $$)"

# ---- non-finite step → roll back, skip the batch; same weights as a run told to skip it ----
out="$W/nan"
ZAYA_FAULT=nan@6 $SUP --skip-width 2 -- $ZAYA train "$W/run.json" --override out_dir="$out" --quiet >"$out.log" 2>&1
rc=$?
check "nonfinite: supervisor exit 0" test $rc -eq 0
check "nonfinite: faults.jsonl = nonfinite restart done ($(events "$out"))" test "$(events "$out")" = "nonfinite restart done"
check "nonfinite: skip window [5, 6] recorded" python3 -c "
import json, sys; e = [json.loads(l) for l in open('$out/faults.jsonl')][0]; sys.exit(e.get('skip') != [5, 6])"
$ZAYA train "$W/run.json" --override out_dir="$W/skip56" --skip-data 5:6 --quiet >"$W/skip56.log" 2>&1
check "nonfinite: final weights byte-identical to train --skip-data 5:6" cmp -s "$W/skip56/final/model.safetensors" "$out/final/model.safetensors"
check "nonfinite: metrics show every step once" steps_once "$out"
check "nonfinite: trainer exits 3 on its own" bash -c "ZAYA_FAULT=nan@2 $ZAYA train '$W/run.json' --override out_dir='$W/nan_plain' --quiet >/dev/null 2>'$W/nan_plain.err'; test \$? -eq 3 && grep -q 'non-finite loss.*at step 2 (data index 1)' '$W/nan_plain.err'"

# ---- a non-finite step where the launcher ends the other rank before it reports: still non-finite, not a crash.
# A stand-in launcher (deterministic): attempt 1 leaves rank 0 dead with a "running" heartbeat and rank 1
# "nonfinite" at data index 5, waits (the supervisor sees the dead rank first), exits 3; attempt 2 finishes.
out="$W/nan_race"
mkdir -p "$out/heartbeat"
cat >"$W/fake_job.sh" <<'SH'
out=$1
n=$(cat "$out/attempts" 2>/dev/null || echo 0)
echo $((n + 1)) >"$out/attempts"
echo "$@" >>"$out/commands"
hb() { # RANK PID STATE
    printf '{"rank": %d, "world_size": 2, "host": "%s", "pid": %d, "step": 5, "data_index": 5, "loss": 1.0, "step_seconds": 0.01, "time": %s, "state": "%s"}\n' \
        "$1" "$(hostname)" "$2" "$(date +%s.%N)" "$3" >"$out/heartbeat/rank-0000$1.json"
}
if [ "$n" -eq 0 ]; then
    sh -c 'exit 0' &
    dead=$!
    wait $dead
    hb 0 $dead running
    hb 1 $$ nonfinite
    sleep 1
    exit 3
fi
hb 0 $$ done
hb 1 $$ done
SH
$SUP --run-dir "$out" -- bash "$W/fake_job.sh" "$out" >"$out.log" 2>&1
rc=$?
check "nonfinite after a rank seen dead: supervisor exit 0" test $rc -eq 0
check "nonfinite after a rank seen dead: faults.jsonl starts with nonfinite ($(events "$out"))" \
    test "$(events "$out" | cut -d' ' -f1)" = nonfinite
check "nonfinite after a rank seen dead: the relaunch skips data index 5" grep -q -- "--skip-data 5:5" "$out/commands"

# ---- loss spikes (a deliberately touchy detector): roll back, skip, and stay reproducible ----
out="$W/spike"
$SUP --spike-z 1.5 --spike-window 8 --max-restarts 20 -- $ZAYA train "$W/run.json" --override out_dir="$out" \
    --override phases.0.tokens=8192 --quiet >"$out.log" 2>&1
rc=$?
windows=$(python3 -c "import json; print(' '.join(f'--skip-data {a}:{b}' for a, b in json.load(open('$out/supervisor_summary.json'))['skip_windows']))" 2>/dev/null)
check "spike: supervisor exit 0 with spikes detected ($(grep -c '"kind":"spike"' "$out/faults.jsonl" 2>/dev/null); windows: $windows)" \
    test $rc -eq 0 -a -n "$windows"
$ZAYA train "$W/run.json" --override out_dir="$W/spikeref" --override phases.0.tokens=8192 $windows --quiet >"$W/spikeref.log" 2>&1
check "spike: final weights byte-identical to train with the recorded --skip-data windows" \
    cmp -s "$W/spikeref/final/model.safetensors" "$out/final/model.safetensors"

# ---- a checkpoint damaged after publishing: met at resume, quarantined, an older one used ----
out="$W/corrupt"
ZAYA_FAULT=corrupt@6,crash@7 $SUP -- $ZAYA train "$W/run.json" --override out_dir="$out" --quiet >"$out.log" 2>&1
rc=$?
check "bad checkpoint: supervisor exit 0" test $rc -eq 0
check "bad checkpoint: faults.jsonl = crash bad_checkpoint restart done ($(events "$out"))" \
    test "$(events "$out")" = "crash bad_checkpoint restart done"
check "bad checkpoint: moved to checkpoints/quarantine/" test -d "$out/checkpoints/quarantine/step-00000006.bad.0"
check "bad checkpoint: resumed from step 4, final weights byte-identical" cmp -s "$REF" "$out/final/model.safetensors"

out="$W/truncate"
ZAYA_FAULT=truncate@10,crash@11 $SUP -- $ZAYA train "$W/run.json" --override out_dir="$out" --quiet >"$out.log" 2>&1
rc=$?
check "truncated checkpoint: quarantined, resumed from step 8, byte-identical ($(events "$out"))" \
    test $rc -eq 0 -a -d "$out/checkpoints/quarantine/step-00000010.bad.0" -a "$(events "$out")" = "crash bad_checkpoint restart done"
check "truncated checkpoint: final weights byte-identical" cmp -s "$REF" "$out/final/model.safetensors"

# ---- give up after --max-restarts ----
out="$W/giveup"
ZAYA_FAULT=crash@2,crash@3,crash@4 $SUP --max-restarts 2 -- $ZAYA train "$W/run.json" --override out_dir="$out" \
    --override checkpoint.interval=0 --quiet >"$out.log" 2>&1
rc=$?
check "give-up: exit 1" test $rc -eq 1
check "give-up: clear message" grep -q "zaya: supervise: gave up after 2 restarts (--max-restarts 2); last fault: crash" "$out.log"
check "give-up: faults.jsonl ends with giveup ($(events "$out"))" test "$(events "$out")" = "crash restart crash restart crash giveup"
check "give-up: relaunched from scratch (no checkpoint)" grep -q '"relaunch from scratch"' "$out/faults.jsonl"

# ---- preemption: SIGTERM to the supervisor → the job checkpoints, exit 0; then resume finishes identically ----
out="$W/preempt"
$SUP -- $ZAYA train "$W/run.json" --override out_dir="$out" --override checkpoint.interval=0 --quiet >"$out.log" 2>&1 &
sup=$!
for _ in $(seq 1 600); do grep -q '"state": "running"' "$out/heartbeat/rank-00000.json" 2>/dev/null && break; sleep 0.02; done
kill -TERM $sup
wait $sup
rc=$?
check "preemption: supervisor exit 0" test $rc -eq 0
check "preemption: faults.jsonl = preempted ($(events "$out"))" test "$(events "$out")" = "preempted"
check "preemption: a checkpoint was saved" test -s "$out/checkpoints/latest"
check "preemption: the heartbeat says stopped" grep -q '"state": "stopped"' "$out/heartbeat/rank-00000.json"
$SUP -- $ZAYA train "$W/run.json" --override out_dir="$out" --override checkpoint.interval=0 --resume --quiet >>"$out.log" 2>&1
check "preemption: supervised --resume finishes byte-identical" cmp -s "$REF" "$out/final/model.safetensors"

# ---- a job that stops by itself with a checkpoint (exit 0, heartbeat "stopped"): a stop, not a fault ----
out="$W/stopped"
$SUP -- $ZAYA train "$W/run.json" --override out_dir="$out" --stop-after 4 --quiet >"$out.log" 2>&1
rc=$?
check "external stop: supervisor exit 0, faults.jsonl = preempted, no relaunch ($(events "$out"))" \
    test $rc -eq 0 -a "$(events "$out")" = "preempted" -a "$(grep -c '^zaya supervise: launch' "$out.log")" -eq 1
check "external stop: treated as a stop" grep -q "treated as a stop, not a fault" "$out/faults.jsonl"

# ---- the trainer's resume choices ----
cp -r "$W/crash" "$W/fallback"
latest=$(cat "$W/fallback/checkpoints/latest")
printf '\x01' | dd of="$W/fallback/checkpoints/$latest/model.safetensors" bs=1 seek=3000 conv=notrunc status=none
if $ZAYA train "$W/run.json" --override out_dir="$W/fallback" --resume-from "$W/fallback/checkpoints/$latest" --quiet \
    >/dev/null 2>"$W/rf.err"; then
    bad "--resume-from a corrupt checkpoint was accepted"
else
    grep -q -- "--resume-from .*CRC-32" "$W/rf.err" && ok "--resume-from a corrupt checkpoint: $(head -c 150 "$W/rf.err")" ||
        bad "--resume-from corrupt: $(cat "$W/rf.err")"
fi
rm -rf "$W/fallback/final"
$ZAYA train "$W/run.json" --override out_dir="$W/fallback" --resume --quiet >"$W/fb.log" 2>&1
check "--resume with a corrupt latest falls back to the newest that verifies (and says so)" \
    grep -q "resuming from .*step-00000014, the newest that verifies" "$W/fb.log"

# ---- bad flags ----
expect_fail() { # name, status, message, command...
    local name=$1 status=$2 msg=$3; shift 3
    "$@" >/dev/null 2>"$W/err.txt"
    local rc=$?
    if [ $rc -eq "$status" ] && grep -q -- "$msg" "$W/err.txt"; then ok "$name: $(head -c 140 "$W/err.txt")"; else
        bad "$name: status $rc, message: $(cat "$W/err.txt")"; fi
}
expect_fail "supervise without a command" 2 "no launch command" $ZAYA supervise --run-dir "$W/x"
expect_fail "supervise --max-restarts -1" 2 "max-restarts expects an integer" $ZAYA supervise --max-restarts -1 -- true
expect_fail "supervise unknown option" 2 'unknown option "--bogus"' $ZAYA supervise --bogus 1 -- true
expect_fail "supervise without --run-dir or train RUN.json" 2 "give the run directory with --run-dir" $ZAYA supervise -- sleep 1
expect_fail "train --skip-data 5:3" 1 'skip window "5:3"' $ZAYA train "$W/run.json" --skip-data 5:3
expect_fail "train --resume-from a missing directory" 1 "resume-from" $ZAYA train "$W/run.json" --override out_dir="$W/x2" --resume-from "$W/nothere"
expect_fail "ZAYA_FAULT with an unknown kind" 1 'unknown kind "boom"' env ZAYA_FAULT=boom@3 $ZAYA train "$W/run.json" --override out_dir="$W/x3"
finish
