"""Summary of `zaya bench decode` runs (their `json` lines on stdin), per dtype in the order met: the median step, × bf16
(the ratio of the medians, the median of the rounds' own ratios, rounds paired in order, and the median of the rounds'
ratios of tokens/s per GB/s of each run's own bandwidth probe: the ratio at equal bandwidth), and the share of the
bound that the bytes a step reads (weights and KV cache) set, two ways: the median of the runs' own shares (each
against its own bandwidth probed between its steps), and against the median bandwidth of every probe given (the
machine's bandwidth, with less of one probe's noise); then, where the runs report them, each run's share of its bound
beside its bandwidth, the threads' clock and the CPU time the hypervisor stole (what a shared host gave it). Used by
bench/quant_8b_decode.sh."""
import json
import statistics as st
import sys


def main():
    runs = [json.loads(line.split(None, 1)[1]) for line in sys.stdin if line.startswith("json ")]
    if not runs:
        sys.exit("decode_summary: no `json` lines from zaya bench decode on stdin")
    bandwidth = st.median(r["bandwidth_bytes_per_s"] for r in runs)
    print(f"summary      {len(runs)} runs; median probe bandwidth {bandwidth / 1e9:.1f} GB/s")
    by = {}
    for r in runs:
        by.setdefault(r["dtype"], []).append(r)
    base = [r["median_ms"] for r in by.get("bf16", [])]
    for dtype, rs in by.items():
        ms = [r["median_ms"] for r in rs]
        read = [r["bytes_per_step"] + r.get("kv_bytes_per_step", 0) for r in rs]
        own = [100 * b / r["bandwidth_bytes_per_s"] * 1e3 / r["median_ms"] for b, r in zip(read, rs)]
        pooled = 100 * st.median(read) / bandwidth * 1e3 / st.median(ms)
        line = f"{dtype:5s} median {st.median(ms):.1f} ms (rounds {', '.join(f'{m:.1f}' for m in ms)})"
        if base and dtype != "bf16":
            own_ratios = [b / m for b, m in zip(base, ms)]
            # tokens/s per byte/s of the bandwidth measured beside the steps: the ratio at equal bandwidth
            at_equal = [b["median_ms"] * b["bandwidth_bytes_per_s"] / (r["median_ms"] * r["bandwidth_bytes_per_s"])
                        for b, r in zip(by["bf16"], rs)]
            line += (f"; x bf16 {st.median(base) / st.median(ms):.2f} (rounds' own: median {st.median(own_ratios):.2f}; "
                     f"at equal bandwidth: median {st.median(at_equal):.2f})")
        line += f"; of the bound {pooled:.0f}% at the median bandwidth, {st.median(own):.0f}% by the runs' own probes"
        print("summary      " + line)
        if all("clock_ghz" in r for r in rs):  # what the host gave each run: its own share, clock and stolen time
            print("summary      " + f"{dtype:5s} per run: " + ", ".join(
                f"{s:.0f}% at {r['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s, {r['clock_ghz']:.2f} GHz, "
                f"{100 * r['steal_share']:.1f}% stolen" for s, r in zip(own, rs)))


if __name__ == "__main__":
    main()
