#!/usr/bin/env bash
# The layering of src/ (docs/architecture.md): every `#include "folder/..."` must point to the file's own folder or
# to a folder on a lower layer of the table there. Prints each include that points up or sideways, then
# "layers: N passed, N failed" (a pass per folder without such an include, a failure per include that breaks it).
set -uo pipefail
cd "$(dirname "$0")/.."
declare -A layer
while IFS='|' read -r _ n folders _; do
    n=$(echo "$n" | tr -d ' ')
    [[ "$n" =~ ^[0-9]+$ ]] || continue
    for f in $(echo "$folders" | tr -d '`,'); do layer[$f]=$n; done
done <docs/architecture.md
pass=0 fail=0
for dir in src/*/; do
    d=$(basename "$dir")
    if [ -z "${layer[$d]:-}" ]; then
        echo "FAIL src/$d/ has no layer in docs/architecture.md"
        fail=$((fail + 1))
        continue
    fi
    bad=0
    while IFS=: read -r file line inc; do
        t=$(echo "$inc" | sed -E 's/.*#include "([a-z_]+)\/.*/\1/')
        [ "$t" = "$d" ] && continue
        if [ -z "${layer[$t]:-}" ]; then continue; fi # not a folder of src/ (a system header written with quotes)
        if [ "${layer[$t]}" -ge "${layer[$d]}" ]; then
            echo "FAIL $file:$line includes $t/ (layer ${layer[$t]}) from $d/ (layer ${layer[$d]}): $inc"
            bad=$((bad + 1))
        fi
    done < <(grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]+"[a-z_]+/' "$dir"* 2>/dev/null)
    if [ "$bad" -eq 0 ]; then
        echo "ok   src/$d/ (layer ${layer[$d]}) includes only its own and lower layers"
        pass=$((pass + 1))
    fi
    fail=$((fail + bad))
done
echo "layers: ${pass} passed, ${fail} failed"
[ "$fail" -eq 0 ]
