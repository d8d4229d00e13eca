#!/usr/bin/env bash
# CLI test of `zaya bench ckpt` on the tiny config: what it prints is well-formed (never how fast anything was):
# the four timed rows with median/min/max/MB/s, the disk table, the cold-restore and bit-identical lines, the three
# target ratios (equal to the quotients of the printed values); --json parses with the same numbers; the
# directory it made is gone afterwards (--keep leaves a checkpoint that `zaya ckpt inspect` verifies); --io
# buffered; 2 ranks under mpirun; bad flags fail with a message. Ends with "bench_ckpt: N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/../.."
ZAYA=${ZAYA_BIN:-$PWD/build/zaya}
. tests/cli/fixture.sh
suite_begin bench_ckpt
[ -x "$ZAYA" ] || { bad "setup: $ZAYA not built (run make)"; finish; }
work=$(mktemp -d /tmp/zaya-bench-ckpt-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=2

# Checks a run's stdout and JSON: RANKS STDOUT JSON
cat >"$work/check.py" <<'EOF'
import json, re, sys
ranks, out_path, json_path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
out = open(out_path).read()
errors = []
num = r"([0-9]+(?:\.[0-9]+)?)"
rows = {}
for label in ["snapshot stall", "background write (to publish)", "restore, cold (load + verify)", "memcpy of the snapshot's bytes"]:
    m = re.search(r"^" + re.escape(label) + r"\s+" + r"\s+".join([num] * 4) + r"\s*$", out, re.M)
    if not m:
        errors.append("no row " + label)
        continue
    med, lo, hi, mbs = map(float, m.groups())
    if not (0 <= lo <= med <= hi) or mbs <= 0:
        errors.append("%s: min %g <= median %g <= max %g, MB/s %g" % (label, lo, med, hi, mbs))
    rows[label] = med
m = re.search(r"^model\s+configs/tiny\.json: ([0-9]+) parameters; ([0-9]+) ranks? x ([0-9]+) threads; rounds 2", out, re.M)
if not m or int(m.group(2)) != ranks:
    errors.append("model line")
for line in ["page cache + fdatasync", "O_DIRECT, 1 thread", "O_DIRECT, the writer's threads", "best (the targets' reference)"]:
    if not re.search(r"^  " + re.escape(line) + r".*\s" + num + r"\s+" + num + r"\s*$", out, re.M):
        errors.append("disk line " + line)
if not re.search(r"^cold restore: posix_fadvise\(DONTNEED\) ", out, re.M):
    errors.append("cold restore line")
if "restored state bit-identical to the saved one: yes" not in out:
    errors.append("not bit-identical")
if not re.search(r"^machine\s+.*\(family [0-9]+ model [0-9]+\)", out, re.M):
    errors.append("machine line")
ratios = {}
for key, label in [("stall", "snapshot stall / memcpy"), ("write", "background write / disk write"), ("restore", "restore / disk read")]:
    m = re.search(r"^  " + re.escape(label) + r".*?\s" + num + r"\s+\(target (<=|>=) [0-9.]+\)\s+(met|NOT met)$", out, re.M)
    if not m:
        errors.append("target line " + label)
    else:
        ratios[key] = float(m.group(1))
j = json.load(open(json_path))
for k in ["snapshot_stall_s", "write_s", "restore_s", "memcpy_s", "write_mb_s", "restore_mb_s", "checkpoint_bytes"]:
    if not (isinstance(j.get(k), (int, float)) and j[k] > 0):
        errors.append("json " + k)
if j.get("ranks") != ranks or j.get("restored_identical") is not True:
    errors.append("json ranks / restored_identical")
for side in ["disk_write_mb_s", "disk_read_mb_s"]:
    d = j.get(side, {})
    if set(d) != {"buffered", "direct_1", "direct_threads", "best"} or abs(d["best"] - max(d["buffered"], d["direct_1"], d["direct_threads"])) > 0.2:
        errors.append("json " + side)
if errors == []:
    r = j["ratios"]
    close = lambda a, b: abs(a - b) <= 0.01 + 0.02 * abs(b)
    if not close(r["stall_over_memcpy"], j["snapshot_stall_s"] / j["memcpy_s"]): errors.append("stall ratio")
    if not close(r["write_over_disk"], j["write_mb_s"] / j["disk_write_mb_s"]["best"]): errors.append("write ratio")
    if not close(r["restore_over_disk"], j["restore_mb_s"] / j["disk_read_mb_s"]["best"]): errors.append("restore ratio")
    if not close(ratios["stall"], r["stall_over_memcpy"]): errors.append("printed stall ratio")
    if abs(j["snapshot_stall_s"] - rows["snapshot stall"]) > 1e-3: errors.append("json stall vs table")
print("; ".join(errors) if errors else "ok")
sys.exit(1 if errors else 0)
EOF

run() { # NAME RANKS ARGS... : runs, checks the output
    local name=$1 ranks=$2
    shift 2
    local out="$work/$name.out" js="$work/$name.json"
    if ! "$@" --config configs/tiny.json --rounds 2 --dir "$work/d" --json "$js" >"$out" 2>"$work/$name.err"; then
        bad "$name: exit status $? ($(tail -2 "$work/$name.err"))"
        return
    fi
    local verdict
    verdict=$(python3 "$work/check.py" "$ranks" "$out" "$js" 2>&1)
    [ "$verdict" = ok ] && ok "$name: the table, the disk lines, the targets and --json are well-formed" || bad "$name: $verdict"
}

mkdir -p "$work/d"
run "one rank" 1 "$ZAYA" bench ckpt
check "one rank: the directory it made is gone" bash -c "[ -z \"\$(ls -A '$work/d')\" ]"
run "--io buffered" 1 "$ZAYA" bench ckpt --io buffered --io-threads 2 --chunk-mib 1
"$ZAYA" bench ckpt --config configs/tiny.json --rounds 1 --dir "$work/d" --keep >"$work/keep.out" 2>&1
kept=$(sed -n 's/^kept: //p' "$work/keep.out")
check "--keep: the last checkpoint stays and verifies" bash -c "[ -n '$kept' ] && '$ZAYA' ckpt inspect '$kept' | grep -q 'all files verified'"
if command -v mpirun >/dev/null; then
    fixture_mpi_env
    export OMP_NUM_THREADS=1
    run "2 ranks" 2 timeout 300 mpirun --oversubscribe -np 2 "$ZAYA" bench ckpt
else
    bad "mpirun not installed (2 ranks not tested)"
fi
for args in "--rounds 0" "--io sideways" "--io-threads -1"; do
    # shellcheck disable=SC2086
    msg=$("$ZAYA" bench ckpt --config configs/tiny.json $args 2>&1 >/dev/null)
    st=$?
    check "bad flag $args: fails with a message" bash -c "[ $st -ne 0 ] && echo '$msg' | grep -q 'bench ckpt'"
done
finish
