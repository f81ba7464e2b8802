"""kvtier under a real vLLM engine serving a hybrid model: a tiny random-weight Gemma-2-shaped
model whose layers alternate a 64-token sliding window and full attention. The connector
supports vLLM's hybrid allocator (SupportsHMA), so vLLM keeps it on and gives the model two KV
cache groups; each chunk kvtier stores holds both (docs/HYBRID.md), and loads of such models
are asynchronous. Outputs are compared with a cold recompute (a cache salt used once)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from kvtierd_process import KvtierdProcess
from real_engine import RealEngine, cold_salt, prompt
from tiny_gemma2 import WINDOW, write_tiny_gemma2

CHUNK = 64  # at most the sliding window: a chunk is stored while its blocks are all in it
EXTRA = {"chunk_tokens": CHUNK, "model_id": "tiny-gemma2", "deadline_ms": 2000,
         "prefetch_deadline_ms": 500}


@pytest.fixture(scope="module")
def kvtierd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KvtierdProcess]:
    daemon = KvtierdProcess(dram_bytes="256MiB",
                            workdir=tmp_path_factory.mktemp("kvtierd-hybrid")).start()
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def engine(kvtierd: KvtierdProcess, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[RealEngine]:
    root = tmp_path_factory.mktemp("gemma2")
    model = write_tiny_gemma2(root / "model", seed=1)
    e = RealEngine(model, root / "engine.log", kvtierd.socket, EXTRA, num_blocks=64).wait_ready()
    yield e
    e.close()


def test_a_sliding_window_model_keeps_its_kv_cache_groups_and_loads_equal_cold(
        engine: RealEngine, kvtierd: KvtierdProcess) -> None:
    log = engine.log()
    assert "Turning off hybrid kv cache manager" not in log
    assert f"#kv-groups:sliding_window@{WINDOW}x2,full_attentionx2" in log, \
        "the engine did not run with a sliding-window group and a full-attention group"
    p = prompt(2, 300)
    changed = list(p)
    changed[3] = (changed[3] + 1) % 2048
    cold, cached_cold = engine.one(p, salt=cold_salt())
    assert cached_cold == 0
    assert engine.one(changed, salt=cold_salt())[0] != cold, "the model is not context-sensitive"
    first, cached_first = engine.one(p)  # stored over three prefill steps of 128 tokens
    assert cached_first == 0 and first == cold
    before = int(kvtierd.admin().stats()["hit_tokens"])
    again, cached = engine.one(p)
    assert cached == (300 // CHUNK) * CHUNK  # 256, the window's blocks loaded, the rest not
    assert again == cold
    assert int(kvtierd.admin().stats()["hit_tokens"]) - before >= cached
    q = p[:200] + prompt(3, 90)  # a hit that ends within p: the window before chunk 3's end
    cold_q, _ = engine.one(q, salt=cold_salt())
    out_q, cached_q = engine.one(q)
    assert cached_q == (200 // CHUNK) * CHUNK and out_q == cold_q


def test_a_prompt_of_whole_chunks_loads_all_but_its_last_chunk(engine: RealEngine) -> None:
    """A 256-token prompt: vLLM computes at least its last token, so kvtier promises the
    whole chunks before it (192 tokens), never a part of a chunk it cannot deliver (an
    asynchronous load that falls short fails the request, which would then be looked up and
    fail again)."""
    p = prompt(7, 4 * CHUNK)
    cold, _ = engine.one(p, salt=cold_salt())
    engine.one(p)  # stored
    out, cached = engine.one(p)
    assert cached == 3 * CHUNK
    assert out == cold


def test_a_failed_load_of_a_hybrid_model_recomputes_the_request(engine: RealEngine) -> None:
    """vLLM cannot take a per-block load failure from a model with several groups (it raises);
    kvtier reports the request as failed_recving, and vLLM recomputes it."""
    p = prompt(5, 230)
    cold, _ = engine.one(p, salt=cold_salt())
    engine.one(p)  # stored
    engine.generate([{"prompt": prompt(6, 300), "max_tokens": 4}])  # stale KV in the blocks
    assert engine.call({"op": "evict_before_next_load", "wait_s": 0.7})["armed"]
    faulty = engine.generate([{"prompt": p, "max_tokens": 12}])
    assert faulty["fault"]["evicted"] > 0, "the fault did not run"
    assert faulty["outputs"][0]["tokens"] == cold
    out, cached = engine.one(p)
    assert cached == (230 // CHUNK) * CHUNK, "the prefix was not stored again"
    assert out == cold
