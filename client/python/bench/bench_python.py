"""Store + load through the Python binding vs numpy memcpy, in the same run.

Mirrors `kvtier-bench dram` from Python: one request of 64 chunks, stored (reserve, copy
into the arena, commit) and loaded (lookup with a lease, copy out, release) through
kvtier.Client; the baseline copies the same bytes twice, chunk by chunk, with libc memmove (source -> buffer
-> destination), as `kvtier-bench dram` does with memcpy. Prints GB/s of both and their ratio, medians over the iterations.

    PYTHONPATH=build/python python client/python/bench/bench_python.py --socket S
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import time

import numpy as np

import kvtier

CHUNKS, HEADS, DIM, CHUNK_TOKENS = 64, 8, 128, 64


def bench(client: kvtier.Client, layers: int, iterations: int) -> tuple[float, float, float]:
    ns = client.open_namespace(model_id=f"bench/python-{layers}", num_layers=layers,
                               kv_dtype="bf16", num_kv_heads=HEADS, head_dim=DIM,
                               chunk_tokens=CHUNK_TOKENS)
    nbytes = CHUNKS * ns.payload_bytes
    src = np.random.default_rng(0).integers(0, 256, size=nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    mid = np.empty_like(src)
    kv_rates, base_rates = [], []
    run = np.frombuffer(os.urandom(4), dtype=np.int32)[0]  # fresh prompts on a used daemon
    for it in range(iterations + 1):  # the first round warms up the arena pages
        tokens = np.arange(CHUNKS * CHUNK_TOKENS, dtype=np.int32) + run
        tokens[0] = it  # another prompt each round
        t0 = time.perf_counter()
        stored = client.store(ns, tokens, src)
        loaded = client.load(ns, tokens, dst)
        kv_seconds = time.perf_counter() - t0
        if stored.stored_chunks != CHUNKS or loaded.num_chunks != CHUNKS:
            raise SystemExit(f"store/load incomplete: {stored.stored_chunks} stored, "
                             f"{loaded.num_chunks} loaded, {stored.fail_open or loaded.fail_open}")
        if not np.array_equal(dst, src):
            raise SystemExit("loaded bytes differ from the stored ones")
        t1 = time.perf_counter()  # the check above is in neither figure
        pb = ns.payload_bytes
        for c in range(CHUNKS):  # per chunk, as kvtier copies (and kvtier-bench's baseline)
            ctypes.memmove(mid.ctypes.data + c * pb, src.ctypes.data + c * pb, pb)
        for c in range(CHUNKS):
            ctypes.memmove(dst.ctypes.data + c * pb, mid.ctypes.data + c * pb, pb)
        t2 = time.perf_counter()
        if it > 0:
            kv_rates.append(2 * nbytes / kv_seconds / 1e9)
            base_rates.append(2 * nbytes / (t2 - t1) / 1e9)
    kv, base = statistics.median(kv_rates), statistics.median(base_rates)
    return ns.payload_bytes, kv, base


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--socket", required=True)
    p.add_argument("--iterations", type=int, default=15)
    args = p.parse_args()
    client = kvtier.Client.connect(socket=args.socket, deadline_ms=5000)
    print(f"{'payload':>10} {'iters':>6} {'python GB/s':>12} {'memcpy GB/s':>12} {'ratio':>6}")
    for layers in (1, 4, 16):  # 256 KiB, 1 MiB, 4 MiB per chunk
        payload, kv, base = bench(client, layers, args.iterations)
        print(f"{payload / 2**20:>7.2f} MiB {args.iterations:>6} {kv:>12.2f} {base:>12.2f} "
              f"{kv / base:>6.2f}")
    client.close()


if __name__ == "__main__":
    main()
