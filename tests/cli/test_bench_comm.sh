#!/usr/bin/env bash
# CLI test of `zaya bench comm` (MPI collective benchmarks, nccl-tests format): mpirun -np 2 and -np 3
# (oversubscribed) with float and bf16, checking on: every row has #wrong 0, the table has the nccl-tests columns,
# busbw = algbw x factor (2(n-1)/n, (n-1)/n, 1), the size convention (blocked collectives: n whole blocks), the
# footer; --json parses with one row per size per collective; --plot makes a PNG; a single rank without mpirun;
# bad flags exit non-zero on every rank with a message and without hanging. Ends with
# "bench_comm: N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/../.."
ZAYA=${ZAYA_BIN:-build/zaya}
pass=0
fail=0
check() { # check NAME STATUS [DETAIL]
    if [ "$2" -eq 0 ]; then
        pass=$((pass + 1))
        echo "  ok   $1"
    else
        fail=$((fail + 1))
        echo "  FAIL $1${3:+: $3}"
    fi
}
finish() {
    echo "bench_comm: ${pass} passed, ${fail} failed"
    [ "$fail" -eq 0 ]
    exit
}
if [ ! -x "$ZAYA" ]; then
    check "setup" 1 "$ZAYA not built (run make)"
    finish
fi
if ! command -v mpirun >/dev/null; then
    check "setup" 1 "mpirun not installed (apt openmpi-bin)"
    finish
fi
work=$(mktemp -d /tmp/zaya-bench-comm.XXXXXX)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
# shared memory only; no remote launcher is needed on one machine
MPIRUN=(timeout 60 mpirun --allow-run-as-root --oversubscribe --mca btl self,vader --mca plm_rsh_agent "")
SMALL=(-b 8 -e 64K -n 5 -w 1 -c 1)

# Checks one run's table (stdout) and JSON: NRANKS TYPE OPS(comma list) TABLE JSON
cat >"$work/check.py" <<'EOF'
import json, math, re, sys
nranks, dtype, ops, table_path, json_path = int(sys.argv[1]), sys.argv[2], sys.argv[3].split(","), sys.argv[4], sys.argv[5]
elem = {"float": 4, "bf16": 2}[dtype]
factor = {"all_reduce": 2 * (nranks - 1) / nranks, "reduce_scatter": (nranks - 1) / nranks,
          "all_gather": (nranks - 1) / nranks, "alltoall": (nranks - 1) / nranks, "broadcast": 1.0}
blocked = {"reduce_scatter", "all_gather", "alltoall"}
requested = [8 << k for k in range(14)]  # 8 .. 64K by 2
errors = []
def err(msg):
    errors.append(msg)

lines = open(table_path).read().splitlines()
head = [l for l in lines if l.startswith("#")]
if not any(re.match(r"^# memcpy baseline \(rank 0, 65536 B\): [0-9.]+ GB/s$", l) for l in lines[:3]):
    err("no memcpy baseline line at the top")
cols = ["size", "count", "type", "redop", "root"] + ["time", "algbw", "busbw", "#wrong"] * 2
if not any(l[1:].split() == cols for l in head):
    err("no column header " + " ".join(cols))
if not any(l[1:].split() == ["out-of-place", "in-place"] for l in head):
    err("no out-of-place / in-place header")
units = ["(B)", "(elements)", "(us)", "(GB/s)", "(GB/s)", "(us)", "(GB/s)", "(GB/s)"]
if not any(l[1:].split() == units for l in head):
    err("no units header")
rows, section = {}, None
for l in lines:
    m = re.match(r"^# ([a-z_]+) \(busbw factor", l)
    if m:
        section = m.group(1)
        rows[section] = []
        continue
    if l.startswith("#") or not l.strip():
        continue
    f = l.split()
    if len(f) != 13 or section is None:
        err("malformed row: " + l)
        continue
    rows[section].append(f)
if list(rows) != ops:
    err(f"sections {list(rows)} != {ops}")
for op, rs in rows.items():
    if len(rs) != len(requested):
        err(f"{op}: {len(rs)} rows, expected {len(requested)}")
    for f, req in zip(rs, requested):
        size, count = int(f[0]), int(f[1])
        want_count = req // elem // nranks if op in blocked else req // elem
        want_size = want_count * elem * (nranks if op in blocked else 1)
        if (size, count) != (want_size, want_count):
            err(f"{op} {req}: size/count {size}/{count}, expected {want_size}/{want_count}")
        if f[2] != dtype or f[3] != ("sum" if op in ("all_reduce", "reduce_scatter") else "none"):
            err(f"{op} {req}: type/redop {f[2]}/{f[3]}")
        if int(f[4]) != (0 if op == "broadcast" else -1):
            err(f"{op} {req}: root {f[4]}")
        for p in (5, 9):
            t, alg, bus, wrong = float(f[p]), float(f[p + 1]), float(f[p + 2]), f[p + 3]
            if wrong != "0":
                err(f"{op} {req}: #wrong {wrong}")
            if not t > 0:
                err(f"{op} {req}: time {t}")
            # two printed decimals: algbw is off by <= 0.005, busbw by <= 0.005
            if abs(bus - alg * factor[op]) > 0.005 * (1 + factor[op]) + 1e-9:
                err(f"{op} {req}: busbw {bus} != algbw {alg} x {factor[op]:.3f}")
            # algbw = size / time, up to the printed rounding of both (time: 2, 1 or 0 decimals)
            dt = 0.005 if t < 100 else 0.05 if t < 10000 else 0.5
            lo = size / ((t + dt) * 1e3) - 0.005
            hi = size / ((t - dt) * 1e3) + 0.005 if t > dt else math.inf
            if not lo <= alg <= hi:
                err(f"{op} {req}: algbw {alg} != size / time = {size / t / 1e3:.3f}")
tail = lines[-3:]
if not any(re.match(r"^# Out of bounds values : 0 OK$", l) for l in tail):
    err("footer: no '# Out of bounds values : 0 OK'")
m = [re.match(r"^# Avg bus bandwidth +: ([0-9.]+)$", l) for l in tail]
m = [x for x in m if x]
if not m:
    err("footer: no '# Avg bus bandwidth : X'")

j = json.load(open(json_path))
if j["nranks"] != nranks or j["type"] != dtype or j["wrong_total"] != 0:
    err(f"json header: nranks {j['nranks']} type {j['type']} wrong_total {j['wrong_total']}")
keys = [(r["op"], r["requested_bytes"]) for r in j["rows"]]
if len(keys) != len(set(keys)) or sorted(keys) != sorted((o, s) for o in ops for s in requested):
    err("json: not one row per size per collective")
bus_all = []
for r in j["rows"]:
    if abs(r["bus_factor"] - factor[r["op"]]) > 1e-12:
        err(f"json {r['op']}: bus_factor {r['bus_factor']}")
    for p in ("out_of_place", "in_place"):
        x = r[p]
        bus_all.append(x["busbw_gbps"])
        if x["wrong"] != 0:
            err(f"json {r['op']} {r['size_bytes']} {p}: wrong {x['wrong']}")
        if not math.isclose(x["busbw_gbps"], x["algbw_gbps"] * factor[r["op"]], rel_tol=1e-9, abs_tol=1e-12):
            err(f"json {r['op']} {r['size_bytes']} {p}: busbw != algbw x factor")
        if not math.isclose(x["algbw_gbps"], r["size_bytes"] / (x["time_us"] * 1e3), rel_tol=1e-9, abs_tol=1e-12):
            err(f"json {r['op']} {r['size_bytes']} {p}: algbw != size / time")
if not math.isclose(j["avg_busbw_gbps"], sum(bus_all) / len(bus_all), rel_tol=1e-9, abs_tol=1e-12):
    err("json: avg_busbw_gbps is not the mean busbw")
if m and abs(float(m[0].group(1)) - j["avg_busbw_gbps"]) > 5e-5:
    err("footer average differs from the JSON's")
if j["memcpy_baseline"]["bytes"] != 65536 or not j["memcpy_baseline"]["gbps"] > 0:
    err("json: memcpy baseline")
for e in errors[:10]:
    print("    " + e)
sys.exit(1 if errors else 0)
EOF

is_png() { [ "$(head -c 8 "$1" 2>/dev/null | od -An -tx1 | tr -d ' \n')" = "89504e470d0a1a0a" ]; }
ALL=all_reduce,reduce_scatter,all_gather,broadcast,alltoall

# --- every collective, float and bf16, 2 and 3 ranks ----------------------------------------------------------------
for np in 2 3; do
    for dt in float bf16; do
        name="np $np $dt"
        out="$work/np$np-$dt"
        "${MPIRUN[@]}" -np "$np" "$ZAYA" bench comm "${SMALL[@]}" -d "$dt" --json "$out.json" --plot "$out.png" \
            >"$out.txt" 2>"$out.err"
        rc=$?
        check "$name: runs (exit 0)" $rc "$(tail -3 "$out.err")"
        [ "$np$dt" = 2float ] && sed -n '1,12p' "$out.txt" | sed 's/^/    /'
        detail=$(python3 "$work/check.py" "$np" "$dt" "$ALL" "$out.txt" "$out.json" 2>&1)
        check "$name: #wrong 0, columns, size/count, busbw = algbw x factor, footer, JSON rows" $? "$detail"
        is_png "$out.png"
        check "$name: --plot wrote a PNG" $?
    done
done

# --- one collective, another root -----------------------------------------------------------------------------------
"${MPIRUN[@]}" -np 2 "$ZAYA" bench comm -o broadcast -r 1 -b 4 -e 4K -n 3 -w 0 -c 1 >"$work/root.txt" 2>&1
rc=$?
rows=$(grep -Ev '^#' "$work/root.txt" | awk '$5 == 1 && $9 == 0 && $13 == 0' | wc -l)
[ "$rc" -eq 0 ] && [ "$rows" -eq 11 ] && ! grep -q '^# all_reduce' "$work/root.txt"
check "-o broadcast -r 1: 11 rows, root 1, #wrong 0, only broadcast" $? "rc $rc, $rows rows"

# --- a single rank, without mpirun ----------------------------------------------------------------------------------
"$ZAYA" bench comm -b 8 -e 64K -n 3 -w 1 -c 1 --json "$work/one.json" >"$work/one.txt" 2>"$work/one.err"
rc=$?
check "single rank without mpirun: runs" $rc "$(tail -3 "$work/one.err")"
python3 - "$work/one.json" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["nranks"] == 1 and j["wrong_total"] == 0 and len(j["rows"]) == 5 * 14
for r in j["rows"]:
    for p in ("out_of_place", "in_place"):
        # one rank moves nothing: busbw 0 except broadcast (factor 1)
        assert r[p]["wrong"] == 0 and (r[p]["busbw_gbps"] == 0) == (r["op"] != "broadcast"), r
EOF
check "single rank: #wrong 0, busbw factor 0 (1 for broadcast)" $?

# --- bad flags: non-zero on every rank, a message, no hang ----------------------------------------------------------
bad_case() { # bad_case NAME EXPECTED-MESSAGE ARGS...
    local name=$1 want=$2
    shift 2
    # odls_base_sigkill_timeout 0: mpirun otherwise waits 2 s after a rank exits non-zero (the exit status is the same)
    "${MPIRUN[@]}" --mca odls_base_sigkill_timeout 0 -np 2 "$ZAYA" bench comm "$@" >"$work/bad.out" 2>"$work/bad.err"
    local rc=$?
    local msgs
    msgs=$(grep -c "^zaya: .*$want" "$work/bad.err")
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$msgs" -eq 1 ] && ! grep -q '^ *[0-9]' "$work/bad.out"
    check "bad flags under mpirun -np 2: $name" $? "rc $rc, messages $msgs: $(head -2 "$work/bad.err")"
}
bad_case "unknown op" 'unknown collective "all_sum"' -o all_sum
bad_case "unknown type" 'unknown data type "int8"' -d int8
bad_case "-b > -e" '-b 65536 is larger than -e 1024' -b 64K -e 1K
bad_case "-f 1" '-f must be at least 2' -f 1
bad_case "-n 0" '-n must be positive' -n 0
bad_case "-n -2" '-n must be positive' -n -2
bad_case "bad size" 'bad size "12Q"' -b 12Q
bad_case "root not a rank" 'root 2 is not a rank' -r 2
bad_case "unknown option" 'unknown option "--bogus"' --bogus 1
"$ZAYA" bench comm -o nope >/dev/null 2>"$work/bad1.err"
rc=$?
[ "$rc" -eq 1 ] && grep -q 'unknown collective "nope"' "$work/bad1.err"
check "bad flag without mpirun: exit 1 with a message" $? "rc $rc"
"$ZAYA" bench comm --help | grep -q -- '--maxbytes'
check "--help" $?

finish
