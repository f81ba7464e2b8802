"""kvtierd's KV events read the way a router reads them: pyzmq and msgpack from PyPI, no kvtier
code. A workload through the kvtier package stores, loads and evicts (DRAM and NVMe); the index
rebuilt from the events alone, a set of (medium, block hash), must equal the daemon's own listing
(`kvtierctl ls`). The same bytes are then decoded with vLLM's own msgspec decoder when the vllm
venv is there (that test is skipped, saying so, when it is not)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq

import kvtier
from kvtierd_process import KvtierdProcess, bin_dir

CHUNK = 16
TIER_OF_MEDIUM = {"GPU": "hbm", "CPU": "dram", "STORAGE": "nvme"}
END_SEQ = b"\xff" * 8
VLLM_PYTHON = Path(os.environ.get("KVTIER_VENV_ROOT", Path.home() / ".cache/kvtier/venvs")) \
    / "vllm" / "bin" / "python"

Index = set[tuple[str, str]]


def key_hex(block_hash: bytes) -> str:
    """A 16-byte block hash (low64 then high64, little-endian) as kvtierctl ls prints keys."""
    assert isinstance(block_hash, bytes) and len(block_hash) == 16, block_hash
    return block_hash[::-1].hex()


def apply(batch: Any, index: Index) -> None:
    """What a router does with one batch: [ts, [event...], data_parallel_rank]."""
    ts, events, dp_rank = batch
    assert isinstance(ts, float) and dp_rank == 0
    for e in events:
        if e["type"] == "AllBlocksCleared":
            index.clear()
            continue
        tier = TIER_OF_MEDIUM[e["medium"]]
        for h in e["block_hashes"]:
            if e["type"] == "BlockStored":
                assert e["block_size"] == CHUNK and e["lora_id"] is None
                assert len(e["token_ids"]) == CHUNK
                index.add((tier, key_hex(h)))
            else:
                assert e["type"] == "BlockRemoved", e
                index.discard((tier, key_hex(h)))


class Subscriber:
    """A SUB socket on the events endpoint and a DEALER on the replay one."""

    def __init__(self, events: str, replay: str) -> None:
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(events)
        self.replay_socket = self.ctx.socket(zmq.DEALER)
        self.replay_socket.connect(replay)
        self.messages: list[tuple[int, bytes]] = []  # (seq, payload) received live

    def drain(self, wait_ms: int = 50) -> None:
        while self.sub.poll(wait_ms):
            topic, seq, payload = self.sub.recv_multipart()
            assert topic == b"" and len(seq) == 8
            self.messages.append((int.from_bytes(seq, "big"), payload))
            wait_ms = 20

    def replay(self, start: int) -> list[tuple[int, bytes]]:
        self.replay_socket.send_multipart([b"", start.to_bytes(8, "big")])
        out = []
        while True:
            assert self.replay_socket.poll(5000), "no end marker from the replay socket"
            empty, topic, seq, payload = self.replay_socket.recv_multipart()
            assert empty == b""
            if seq == END_SEQ:
                return out
            out.append((int.from_bytes(seq, "big"), payload))

    def close(self) -> None:
        self.ctx.destroy(linger=0)


def rebuild(messages: list[tuple[int, bytes]]) -> Index:
    index: Index = set()
    for _, payload in messages:
        apply(msgpack.unpackb(payload), index)
    return index


def listing(daemon: KvtierdProcess, ns_id: str) -> Index:
    r = subprocess.run([str(bin_dir() / "kvtierctl"), "--socket", daemon.socket, "--json", "ls",
                        "--namespace", ns_id, "--limit", "100000"],
                       capture_output=True, text=True, timeout=30, check=True)
    return {(tier, c["key"]) for c in json.loads(r.stdout)["chunks"] for tier in c["tiers"]}


def run_workload(tmp_path: Path) -> tuple[list[tuple[int, bytes]], Index]:
    """Stores and loads 40 prompts of 4 chunks (20 KiB slots) through 2 MiB of DRAM and 1 MiB
    of NVMe, so that both evict, then
    checks the events against the listing. Returns every batch (from the replay) and the index."""
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    events, replay = f"ipc://{tmp_path}/events", f"ipc://{tmp_path}/replay"
    args = ["--nvme-path", str(nvme), "--nvme-bytes", "1MiB", "--events-address", events,
            "--events-replay-address", replay]
    with KvtierdProcess(dram_bytes="2MiB", extra_args=args) as daemon:
        sub = Subscriber(events, replay)
        try:
            time.sleep(0.3)  # the SUB connection comes up asynchronously
            with kvtier.Client.connect(socket=daemon.socket, deadline_ms=2000) as c:
                ns = c.open_namespace(model_id="test/events", num_layers=2, kv_dtype="float16",
                                      num_kv_heads=2, head_dim=64, chunk_tokens=CHUNK)
                rng = np.random.default_rng(3)
                for i in range(40):
                    tokens = rng.integers(0, 128_000, size=4 * CHUNK, dtype=np.int32)
                    data = rng.integers(0, 256, size=4 * ns.payload_bytes, dtype=np.uint8)
                    c.store(ns, tokens, data)
                    c.load(ns, tokens, np.empty_like(data))
            want: Index = set()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # write-through to NVMe runs behind the stores
                sub.drain()
                want = listing(daemon, ns.id)
                if rebuild(sub.messages) == want:
                    break
            live = rebuild(sub.messages)
            assert live == want, (f"{len(live - want)} indexed but not listed, "
                                  f"{len(want - live)} listed but not indexed")
            assert {t for t, _ in want} == {"dram", "nvme"}
            removed = sum(1 for _, p in sub.messages for e in msgpack.unpackb(p)[1]
                          if e["type"] == "BlockRemoved")
            assert removed > 0, "the workload evicted nothing"
            # Live batches follow one another; batch 0 (AllBlocksCleared, at start) came
            # before this subscriber: a gap the replay fills.
            seqs = [s for s, _ in sub.messages]
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "a gap without drops"
            everything = sub.replay(0)
            assert [s for s, _ in everything] == list(range(len(everything)))
            assert msgpack.unpackb(everything[0][1])[1][0] == {"type": "AllBlocksCleared"}
            assert dict(everything)[seqs[0]] == sub.messages[0][1]
            assert rebuild(everything) == want
            return everything, want
        finally:
            sub.close()


def test_the_index_rebuilt_from_events_equals_the_daemons_listing(tmp_path: Path) -> None:
    run_workload(tmp_path)


VLLM_DECODE = """
import json, sys, msgspec
from vllm.distributed.kv_events import KVEventBatch, BlockStored, BlockRemoved, AllBlocksCleared
decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
index = set()
for payload in msgspec.msgpack.decode(sys.stdin.buffer.read(), type=list[bytes]):
    batch = decoder.decode(payload)
    for e in batch.events:
        if isinstance(e, AllBlocksCleared):
            index.clear()
        elif isinstance(e, BlockStored):
            index.update((e.medium, h[::-1].hex()) for h in e.block_hashes)
        else:
            assert isinstance(e, BlockRemoved)
            index.difference_update((e.medium, h[::-1].hex()) for h in e.block_hashes)
print(json.dumps(sorted(index)))
"""


def test_vllms_own_decoder_reads_the_stream(tmp_path: Path) -> None:
    if not VLLM_PYTHON.exists():
        pytest.skip(f"no vllm venv at {VLLM_PYTHON} (tools/install-deps.sh --engines): vLLM's "
                    "decoder not run")
    everything, want = run_workload(tmp_path)
    r = subprocess.run([str(VLLM_PYTHON), "-c", VLLM_DECODE],
                       input=msgpack.packb([p for _, p in everything]),
                       capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    decoded = {(TIER_OF_MEDIUM[m], h) for m, h in json.loads(r.stdout.decode().strip().splitlines()[-1])}
    assert decoded == want
