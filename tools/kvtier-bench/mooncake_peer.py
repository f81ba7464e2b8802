"""kvtier-bench peers' Mooncake Store leg: put and get of one round of values at a time.

Starts mooncake_master (from the same venv) on free loopback ports, mounts a global segment
in this process through the TCP transport, and for each value size puts `--chunks` values
from a registered buffer (batch_put_from) and gets them into another (batch_get_into): the
store's zero-copy batch calls, the fair comparison. Every value is checked byte for byte.
Prints one JSON object per value size on stdout: {"value": bytes, "put_s": [...],
"get_s": [...]} (seconds of each measured round), and the master's log on failure.

Exit status: 0, or 1 with the reason on stderr.
"""

from __future__ import annotations

import argparse
import ctypes
import faulthandler
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# No BLAS threads: the master is started with a preexec_fn, which wants a single thread.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
import numpy as np  # noqa: E402


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


SETUP_SECONDS = 60


def die_with_parent() -> None:
    """SIGTERM to the calling process when its parent ends, however it ends."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGTERM)


def wait_for_port(port: int, master: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if master.poll() is not None:
            raise RuntimeError(f"mooncake_master exited with {master.returncode}: "
                               f"{log.read_text(errors='replace')[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"mooncake_master did not listen on port {port} within 20 s")


def measure(store: Any, value: int, chunks: int, iterations: int, seed: int) -> dict[str, Any]:
    src = np.random.default_rng(seed).integers(0, 256, value * chunks, dtype=np.uint8)
    dst = np.zeros_like(src)
    for buf in (src, dst):
        if store.register_buffer(buf.ctypes.data, buf.nbytes) != 0:
            raise RuntimeError(f"register_buffer of {buf.nbytes} bytes failed")
    put_s: list[float] = []
    get_s: list[float] = []
    sizes = [value] * chunks
    src_ptrs = [src.ctypes.data + i * value for i in range(chunks)]
    dst_ptrs = [dst.ctypes.data + i * value for i in range(chunks)]
    for it in range(-2, iterations):  # two warm-up rounds, not counted
        keys = [f"kvtier-bench:{seed}:{value}:{it}:{i}" for i in range(chunks)]
        src[:8] = np.frombuffer((it + 3).to_bytes(8, "little"), dtype=np.uint8)  # new bytes
        dst[:] = 0
        t0 = time.perf_counter()
        put = store.batch_put_from(keys, src_ptrs, sizes)
        t1 = time.perf_counter()
        got = store.batch_get_into(keys, dst_ptrs, sizes)
        t2 = time.perf_counter()
        if any(rc != 0 for rc in put):
            raise RuntimeError(f"batch_put_from of {value}-byte values returned {sorted(set(put))}")
        if any(n != value for n in got):
            raise RuntimeError(f"batch_get_into of {value}-byte values returned {sorted(set(got))}")
        if not np.array_equal(src, dst):
            raise RuntimeError(f"Mooncake returned other bytes for {value}-byte values")
        # Untimed: each round starts from an empty store. A get leases its objects for 500 ms.
        left = keys
        for _ in range(200):
            codes = store.batch_remove(left)
            left = [k for k, rc in zip(left, codes) if rc != 0]
            if not left:
                break
            time.sleep(0.01)
        else:
            raise RuntimeError(f"batch_remove of {len(left)} objects kept failing for 2 s "
                               f"(codes {sorted(set(codes))})")
        if it >= 0:
            put_s.append(t1 - t0)
            get_s.append(t2 - t1)
    for buf in (src, dst):
        store.unregister_buffer(buf.ctypes.data)
    return {"value": value, "put_s": put_s, "get_s": get_s}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--values", required=True, help="value sizes in bytes, comma-separated")
    parser.add_argument("--chunks", type=int, required=True, help="values per round")
    parser.add_argument("--iterations", type=int, required=True, help="measured rounds per size")
    args = parser.parse_args()
    values = [int(v) for v in args.values.split(",")]
    die_with_parent()  # this script goes with kvtier-bench, and its master with it
    master_bin = Path(sys.executable).parent / "mooncake_master"
    if not master_bin.exists():
        print(f"mooncake_peer: no mooncake_master beside {sys.executable} "
              "(tools/install-python-envs.sh peers)", file=sys.stderr)
        return 1
    from mooncake.store import MooncakeDistributedStore  # type: ignore[import-not-found]

    rpc, http, metrics = free_port(), free_port(), free_port()
    with tempfile.TemporaryDirectory(prefix="kvtier-bench-mooncake.") as tmp:
        log = Path(tmp) / "master.log"
        with open(log, "wb") as log_file:
            master = subprocess.Popen(
                [str(master_bin), f"--rpc_port={rpc}", "--enable_http_metadata_server=true",
                 f"--http_metadata_server_port={http}", f"--metrics_port={metrics}",
                 "--default_kv_lease_ttl=500", "--rpc_address=127.0.0.1"],
                stdout=log_file, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
        try:
            wait_for_port(rpc, master, log)
            wait_for_port(http, master, log)
            store = MooncakeDistributedStore()
            # Room for one round of the largest size, twice over (removal is not instant).
            segment = 2 * max(values) * args.chunks + (64 << 20)
            # setup blocks in native code, holding the GIL (a master that accepts and never
            # answers would hold it forever): faulthandler's own thread then prints where
            # this script stands and exits it.
            faulthandler.dump_traceback_later(SETUP_SECONDS, exit=True)
            rc = store.setup("127.0.0.1", f"http://127.0.0.1:{http}/metadata", segment,
                             64 << 20, "tcp", "", f"127.0.0.1:{rpc}")
            faulthandler.cancel_dump_traceback_later()
            if rc != 0:
                raise RuntimeError(f"MooncakeDistributedStore.setup returned {rc}")
            for value in values:
                row = measure(store, value, args.chunks, args.iterations, seed=value)
                print(json.dumps(row), flush=True)
            store.close()
        except RuntimeError as e:
            print(f"mooncake_peer: {e}", file=sys.stderr, flush=True)
            return 1
        finally:
            master.terminate()
            try:
                master.wait(timeout=10)
            except subprocess.TimeoutExpired:
                master.kill()
                master.wait()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("GLOG_minloglevel", "2")  # Mooncake's INFO and WARNING lines
    sys.exit(main())
