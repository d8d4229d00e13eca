#!/usr/bin/env bash
# CI's warning check (make strict): the library, the CLI and the unit tests built with -Werror by each compiler at
# each -march target, each into build-strict/CC-TARGET/. A warning that only one compiler or one CPU target shows
# (gcc's -Wmaybe-uninitialized moves with the vectoriser, which moves with -march) fails here, not in a user's build.
# Targets: the default baseline, x86-64-v3 (AVX2: Zen 3, Haswell and later), x86-64-v4 (AVX-512: Zen 4/5,
# Skylake-X and later), and this machine's native one. Ends with "strict: N passed, N failed" (one per build).
set -uo pipefail
cd "$(dirname "$0")/.."
ccs=${STRICT_CCS:-gcc clang}
# STRICT_CUDA=0: the CUDA sources were checked elsewhere (CI's make test builds them once with WERROR=1);
# STRICT_SKIP="gcc-default ...": builds checked elsewhere (CI's make test is gcc at the default -march, WERROR=1).
strict_cuda=${STRICT_CUDA:-1}
skip=" ${STRICT_SKIP:-} "
archs=${STRICT_ARCHS:-default x86-64-v3 x86-64-v4 native}
[ "$(uname -m)" = x86_64 ] || archs="default native"
jobs=${STRICT_JOBS:-$(nproc)}
mkdir -p build-strict
pass=0
fail=0
for cc in $ccs; do
    for arch in $archs; do
        dir=build-strict/$cc-$arch
        if [[ "$skip" == *" $cc-$arch "* ]]; then
            echo "(the $cc -Werror build at ${arch/default/the default -march} was make test's own)"
            continue
        fi
        archflag=()
        label="the default -march"
        [ "$arch" = default ] || { archflag=(ARCH=-march=$arch); label="-march=$arch"; }
        # the CUDA sources (src/gpu/*.cu, nvcc -Werror) once, in the first build: their warnings do not move with -march
        cuda=(CUDA=0)
        [ "$strict_cuda" = 1 ] && [ "$cc-$arch" = "${ccs%% *}-${archs%% *}" ] && cuda=()
        # DEBUG=: no debug information (a fifth of the compile time, and no warning depends on it)
        if make --no-print-directory -s -j"$jobs" CC="$cc" WERROR=1 DEBUG= BUILD="$dir" "${archflag[@]}" "${cuda[@]}" \
            "$dir/zaya" "$dir/zaya_tests" >"$dir.log" 2>&1; then
            echo "ok   $cc $label -Werror"
            pass=$((pass + 1))
        else
            echo "FAIL $cc $label -Werror (log: $dir.log)"
            grep -E 'error|warning' "$dir.log" | head -20 | sed 's/^/    /'
            fail=$((fail + 1))
        fi
    done
done
[ "$strict_cuda" = 1 ] || echo "(the CUDA sources' -Werror check was make test's own build: WERROR=1)"
echo "strict: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
