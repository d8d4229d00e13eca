"""Checkpoints side by side: the same tensors (the shapes and bytes of a zaya checkpoint: model.safetensors and each
rank's optimizer shard) through torch.save + fsync / torch.load, and through torch.distributed.checkpoint (DCP: a
synchronous save, async_save, load), against `zaya bench ckpt` on the same config, in the same directory, rounds
alternating between them; the table shows medians. Every load is cold: the files' pages are dropped with
posix_fadvise(DONTNEED) after an fsync first (reported if that did not work).

- torch.save: one file per rank (rank 0 also holds the model's tensors, as zaya's rank 0 writes model.safetensors),
  written, flushed and fsynced; torch.load reads it back (weights_only, into new tensors).
- DCP save / load: dcp.save and dcp.load (in place) of the rank's tensors under a gloo process group, the default
  FileSystemWriter (which fsyncs) and planner.
- DCP async_save: the stall is until async_save returns (its staging copy of the state), the total until the
  future's result (written).
- zaya: `zaya bench ckpt --rounds 1 --json` per round (its snapshot stall, background write, cold restore).

With --ranks 2, torch runs 2 processes (gloo) and zaya runs under mpirun -np 2; each rank holds its zaya rank's
tensors. Usage:
  python3 bench/vs_torch_ckpt.py --config configs/bench-medium.json [--ranks 1|2] [--rounds 3] [--dir /tmp]
      [--threads N] [--json FILE] [--no-zaya]
"""
import argparse
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ZAYA = os.path.join(ROOT, "build", "zaya")


def safetensors_shapes(path):
    """[(name, shape)] of a safetensors file's tensors, in file order (all F32 in a zaya checkpoint)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    items = [(k, v) for k, v in header.items() if k != "__metadata__"]
    items.sort(key=lambda kv: kv[1]["data_offsets"][0])
    for k, v in items:
        assert v["dtype"] == "F32", (path, k, v["dtype"])
    return [(k, v["shape"]) for k, v in items]


def zaya_layout(config, ranks, workdir, threads):
    """The tensors each rank saves in zaya: a checkpoint of the config made by `zaya bench ckpt --keep`."""
    cmd = [ZAYA, "bench", "ckpt", "--config", config, "--rounds", "1", "--keep", "--dir", workdir]
    out = run_zaya(cmd, ranks, threads)
    kept = [l.split("kept: ", 1)[1] for l in out.splitlines() if l.startswith("kept: ")]
    if not kept:
        sys.exit("zaya bench ckpt --keep did not say where it kept the checkpoint:\n" + out)
    ckpt = kept[0]
    layout = []
    for r in range(ranks):
        names = safetensors_shapes(os.path.join(ckpt, "optimizer-%05d-of-%05d.safetensors" % (r, ranks)))
        if r == 0:
            names = safetensors_shapes(os.path.join(ckpt, "model.safetensors")) + names
        layout.append(names)
    shutil.rmtree(os.path.dirname(os.path.dirname(ckpt)), ignore_errors=True)
    return layout


def run_zaya(cmd, ranks, threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    if ranks > 1:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_btl="self,vader")
        cmd = ["mpirun", "--oversubscribe", "-np", str(ranks)] + cmd
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("failed: %s\n%s%s" % (" ".join(cmd), p.stdout, p.stderr))
    return p.stdout


def drop_pages(paths):
    """posix_fadvise(DONTNEED) after fsync; the fraction of their pages still resident (mincore), None if unknown."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    page = os.sysconf("SC_PAGE_SIZE")
    resident = total = 0
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            size = os.fstat(fd).st_size
            if size == 0:
                continue
            addr = libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
            if addr in (None, ctypes.c_void_p(-1).value):
                return None
            pages = (size + page - 1) // page
            vec = (ctypes.c_ubyte * pages)()
            ok = libc.mincore(addr, size, vec) == 0
            libc.munmap(addr, size)
            if not ok:
                return None
            resident += sum(v & 1 for v in vec)
            total += pages
        finally:
            os.close(fd)
    return resident / total if total else None


def files_under(path):
    if os.path.isfile(path):
        return [path]
    return [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]


def torch_worker(rank, ranks, layout, workdir, rounds, threads, port, result_path):
    """One rank: every variant, `rounds` times; rank 0 writes the medians' inputs as JSON."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    torch.set_num_threads(threads)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=ranks)
    g = torch.Generator().manual_seed(rank)
    state = {name: torch.randn(shape, generator=g) for name, shape in layout[rank]}
    my_bytes = sum(t.numel() * 4 for t in state.values())
    times = {k: [] for k in ["torch_save", "torch_load", "dcp_save", "dcp_load", "dcp_async_stall", "dcp_async_total"]}
    cold = []

    def slowest(t):
        x = torch.tensor([t], dtype=torch.float64)
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
        return float(x)

    def timed(fn):
        dist.barrier()
        t0 = time.perf_counter()
        out = fn()
        return slowest(time.perf_counter() - t0), out

    for r in range(rounds):
        # torch.save + fsync, torch.load cold
        path = os.path.join(workdir, "torch-%d.pt" % rank)

        def save():
            with open(path, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
        t, _ = timed(save)
        times["torch_save"].append(t)
        cold.append(drop_pages([path]))
        t, loaded = timed(lambda: torch.load(path, weights_only=True))
        times["torch_load"].append(t)
        assert all(torch.equal(loaded[k], state[k]) for k in list(state)[:3])
        del loaded
        os.unlink(path)
        # DCP: sync save, load in place
        ckpt = os.path.join(workdir, "dcp-sync-%d" % r)
        t, _ = timed(lambda: dcp.save(state, checkpoint_id=ckpt))
        times["dcp_save"].append(t)
        dist.barrier()
        if rank == 0:
            cold.append(drop_pages(files_under(ckpt)))
        target = {k: torch.empty_like(v) for k, v in state.items()}
        t, _ = timed(lambda: dcp.load(target, checkpoint_id=ckpt))
        times["dcp_load"].append(t)
        assert all(torch.equal(target[k], state[k]) for k in list(state)[:3])
        del target
        dist.barrier()
        if rank == 0:
            shutil.rmtree(ckpt, ignore_errors=True)
        # DCP async_save: the stall (staging) and the total (written)
        ckpt = os.path.join(workdir, "dcp-async-%d" % r)
        dist.barrier()
        t0 = time.perf_counter()
        fut = dcp.async_save(state, checkpoint_id=ckpt)
        stall = time.perf_counter() - t0
        fut.result()
        total = time.perf_counter() - t0
        times["dcp_async_stall"].append(slowest(stall))
        times["dcp_async_total"].append(slowest(total))
        dist.barrier()
        if rank == 0:
            shutil.rmtree(ckpt, ignore_errors=True)
    b = torch.tensor([my_bytes], dtype=torch.float64)
    dist.all_reduce(b)
    if rank == 0:
        with open(result_path, "w") as f:
            json.dump({"times": times, "bytes": float(b), "cold": cold, "torch": torch.__version__}, f)
    dist.destroy_process_group()


def torch_round(ranks, layout, workdir, threads, port):
    """One round of every torch variant, in fresh processes; returns the worker's JSON."""
    result = os.path.join(workdir, "torch-result.json")
    args = json.dumps([ranks, layout, workdir, 1, threads, port, result])
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", str(r), args]) for r in range(ranks)]
    if any(p.wait() != 0 for p in procs):
        sys.exit("a torch worker failed")
    with open(result) as f:
        return json.load(f)


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        ranks, layout, workdir, rounds, threads, port, result = json.loads(sys.argv[3])
        torch_worker(int(sys.argv[2]), ranks, layout, workdir, rounds, threads, port, result)
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True)
    ap.add_argument("--ranks", type=int, default=1, choices=[1, 2])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="threads per rank (all cores / ranks)")
    ap.add_argument("--json")
    ap.add_argument("--no-zaya", action="store_true", help="torch only")
    a = ap.parse_args()
    threads = max(1, a.threads // a.ranks) if a.threads == (os.cpu_count() or 1) else a.threads
    workdir = tempfile.mkdtemp(prefix="vs-torch-ckpt.", dir=a.dir)
    try:
        layout = zaya_layout(a.config, a.ranks, workdir, threads)
        rows = {}
        colds = []
        mb = None
        port = 29500 + os.getpid() % 1000
        for r in range(a.rounds):  # alternating: zaya, then torch, each round
            if not a.no_zaya:
                zjson = os.path.join(workdir, "zaya.json")
                run_zaya([ZAYA, "bench", "ckpt", "--config", a.config, "--rounds", "1", "--dir", workdir,
                          "--json", zjson], a.ranks, threads)
                with open(zjson) as f:
                    z = json.load(f)
                for k, v in [("zaya_stall", z["snapshot_stall_s"]), ("zaya_write", z["write_s"]),
                             ("zaya_total", z["snapshot_stall_s"] + z["write_s"]), ("zaya_restore", z["restore_s"])]:
                    rows.setdefault(k, []).append(v)
                colds.append(z["cold_resident_fraction"])
            t = torch_round(a.ranks, layout, workdir, threads, port + r)
            for k, v in t["times"].items():
                rows.setdefault(k, []).extend(v)
            colds.extend(t["cold"])
            mb = t["bytes"] / 1e6
            version = t["torch"]
        med = {k: statistics.median(v) for k, v in rows.items()}
        print("state        %s: %.1f MB of float32 tensors (zaya's checkpoint: model + optimizer shards), %d rank%s x "
              "%d threads, %d rounds alternating (medians, the slowest rank); torch %s"
              % (a.config, mb, a.ranks, "s" if a.ranks > 1 else "", threads, a.rounds, version))
        known = [c for c in colds if c is not None]
        print("cold loads   posix_fadvise(DONTNEED) after fsync: %s" %
              ("at most %.1f%% of the pages stayed cached" % (100 * max(known)) if known else "residency unknown"))
        print("\n%-44s %10s %10s" % ("", "seconds", "MB/s"))
        labels = [("zaya snapshot stall (training waits)", "zaya_stall"),
                  ("zaya background write (to publish)", "zaya_write"),
                  ("zaya save total (stall + write)", "zaya_total"),
                  ("zaya restore, cold (every byte verified)", "zaya_restore"),
                  ("torch.save + fsync", "torch_save"), ("torch.load, cold", "torch_load"),
                  ("DCP save (sync)", "dcp_save"), ("DCP async_save stall (training waits)", "dcp_async_stall"),
                  ("DCP async_save total", "dcp_async_total"), ("DCP load, cold", "dcp_load")]
        for label, k in labels:
            if k in med:
                print("%-44s %10.3f %10.0f" % (label, med[k], mb / med[k]))
        if "zaya_stall" in med:
            print("\nzaya vs DCP async_save: stall %.2fx shorter, total %.2fx shorter; restore vs DCP load %.2fx faster"
                  % (med["dcp_async_stall"] / med["zaya_stall"], med["dcp_async_total"] / med["zaya_total"],
                     med["dcp_load"] / med["zaya_restore"]))
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"config": a.config, "ranks": a.ranks, "threads": threads, "rounds": a.rounds, "mb": mb,
                           "torch": version, "medians_s": med, "all_s": rows}, f, indent=1)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
