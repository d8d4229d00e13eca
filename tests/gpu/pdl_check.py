#!/usr/bin/env python3
"""Programmatic dependent launch, checked in the source (no GPU needed): a kernel launched through GK_LAUNCH_PDL may
start while the kernel before it still runs, so it must call gk_pdl_enter() (gpu_common.cuh) before it touches what
another kernel writes. For every GK_LAUNCH_PDL in src/gpu/*.cu this finds the kernel it names (a __global__ function of
the same file; a template's arguments are dropped) and checks that its body calls gk_pdl_enter() where every thread
passes it: as a statement of the body itself, with no return or barrier before it. The CPU emulator checks the same at run time for the kernels it
runs (tests/gpu/emu, cuda_emu.h's GK_LAUNCH_PDL). Prints one line a launch site, then "pdl: N passed, N failed"."""
import glob
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def strip_comments(s):
    s = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), s, flags=re.S)
    s = re.sub(r"//[^\n]*", "", s)
    return re.sub(r"__launch_bounds__\([^()]*\)", "", s)  # not the kernel's name


def kernel_bodies(src):
    """name -> list of bodies (templates and overloads may repeat a name)."""
    out = {}
    for m in re.finditer(r"__global__\b[^;{]*?\b([A-Za-z_]\w*)\s*\(", src):
        i, depth = m.end(), 1
        while depth:
            depth += {"(": 1, ")": -1}.get(src[i], 0)
            i += 1
        j = src.find("{", i)
        if j < 0 or src[i:j].strip():
            continue  # a declaration, not a definition
        k, depth = j + 1, 1
        while depth:
            depth += {"{": 1, "}": -1}.get(src[k], 0)
            k += 1
        out.setdefault(m.group(1), []).append(src[j + 1:k - 1])
    return out


def enters_first(body):
    """gk_pdl_enter() reached by every thread: a statement of the body's own (not inside a block or after an if, loop
    or else), with no return and no barrier before it."""
    at = body.find("gk_pdl_enter()")
    if at < 0:
        return False, "does not call gk_pdl_enter()"
    before = body[:at]
    if before.count("{") != before.count("}"):
        return False, "calls gk_pdl_enter() inside a block"
    if before.rstrip() and before.rstrip()[-1] not in ";{}":
        return False, "calls gk_pdl_enter() under an if, loop or else"
    if re.search(r"^\s*#\s*if", before, re.M) and not re.search(r"^\s*#\s*endif", before, re.M):
        return False, "calls gk_pdl_enter() inside a preprocessor branch"
    for bad, why in ((r"\breturn\b", "a return"), (r"__syncthreads|syncwarp|\bgoto\b", "a barrier or goto")):
        if re.search(bad, before):
            return False, "calls gk_pdl_enter() after %s" % why
    return True, ""


# The rule itself, on bodies whose answer is known: (body, whether every thread passes gk_pdl_enter() first).
RULE_CASES = [("gk_pdl_enter(); x();", True), ("for (;;) x(); gk_pdl_enter();", True),
              ("if (a)\n for (i) y();\n gk_pdl_enter();", True), ("int a = 1; if (a) gk_pdl_enter();", False),
              ("if (a) { gk_pdl_enter(); }", False), ("if (t) return; gk_pdl_enter();", False),
              ("__syncthreads(); gk_pdl_enter();", False), ("x();", False), ("#if A\n gk_pdl_enter();\n#endif", False)]


def main():
    passed = failed = 0
    for body, want in RULE_CASES:
        if enters_first(body)[0] == want:
            passed += 1
        else:
            failed += 1
            print("FAIL the rule misjudges %r (expected %s)" % (body, want))
    for path in sorted(glob.glob(os.path.join(ROOT, "src", "gpu", "*.cu"))):
        src = strip_comments(open(path, encoding="utf-8").read())
        kernels = kernel_bodies(src)
        rel = os.path.relpath(path, ROOT)
        for m in re.finditer(r"GK_LAUNCH_PDL\(\s*\(?\s*([A-Za-z_]\w*)", src):
            name, line = m.group(1), src.count("\n", 0, m.start()) + 1
            if name not in kernels:
                ok, why = False, "names %s, not a __global__ function of this file" % name
            else:
                ok, why = True, ""
                for body in kernels[name]:
                    good, reason = enters_first(body)
                    if not good:
                        ok, why = False, "%s %s" % (name, reason)
                        break
            if ok:
                passed += 1
                print("ok   %s:%d %s" % (rel, line, name))
            else:
                failed += 1
                print("FAIL %s:%d %s" % (rel, line, why))
    if passed == len(RULE_CASES):
        failed += 1
        print("FAIL no GK_LAUNCH_PDL found in src/gpu: the check checks nothing")
    print("pdl: %d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
