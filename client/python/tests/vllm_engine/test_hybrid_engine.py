"""kvtier under a real vLLM engine serving a hybrid model: a tiny random-weight Gemma-2-shaped
model whose layers alternate a 64-token sliding window and full attention. The connector
supports vLLM's hybrid allocator (SupportsHMA), so vLLM keeps it on and gives the model two KV
cache groups; each chunk kvtier stores holds both (docs/HYBRID.md), and loads of such models
are asynchronous. Outputs are compared with a cold recompute (a cache salt used once)."""

from __future__ import annotations

from kvtierd_process import KvtierdProcess
from real_engine import (
    RealEngine,
    check_a_failed_load_recomputes,
    cold_context_sensitive,
    cold_salt,
    prompt,
)
from tiny_gemma2 import WINDOW, write_tiny_gemma2

CHUNK = 64  # at most the sliding window: a chunk is stored while its blocks are all in it
WRITE_MODEL = write_tiny_gemma2
EXTRA = {"chunk_tokens": CHUNK, "model_id": "tiny-gemma2", "deadline_ms": 2000,
         "prefetch_deadline_ms": 500}


def test_a_sliding_window_model_keeps_its_kv_cache_groups_and_loads_equal_cold(
        hybrid_engine: RealEngine, hybrid_kvtierd: KvtierdProcess) -> None:
    log = hybrid_engine.log()
    assert "Turning off hybrid kv cache manager" not in log
    assert f"#kv-groups:sliding_window@{WINDOW}x2,full_attentionx2" in log, \
        "the engine did not run with a sliding-window group and a full-attention group"
    p = prompt(2, 300)
    cold = cold_context_sensitive(hybrid_engine, p)
    first, cached_first = hybrid_engine.one(p)  # stored over three prefill steps of 128 tokens
    assert cached_first == 0 and first == cold
    before = int(hybrid_kvtierd.admin().stats()["hit_tokens"])
    again, cached = hybrid_engine.one(p)
    assert cached == (300 // CHUNK) * CHUNK  # 256, the window's blocks loaded, the rest not
    assert again == cold
    assert int(hybrid_kvtierd.admin().stats()["hit_tokens"]) - before >= cached
    q = p[:200] + prompt(3, 90)  # a hit that ends within p: the window before chunk 3's end
    cold_q, _ = hybrid_engine.one(q, salt=cold_salt())
    out_q, cached_q = hybrid_engine.one(q)
    assert cached_q == (200 // CHUNK) * CHUNK and out_q == cold_q


def test_a_prompt_of_whole_chunks_loads_all_but_its_last_chunk(hybrid_engine: RealEngine) -> None:
    """A 256-token prompt: vLLM computes at least its last token, so kvtier promises the
    whole chunks before it (192 tokens), never a part of a chunk it cannot deliver (an
    asynchronous load that falls short fails the request, which would then be looked up and
    fail again)."""
    p = prompt(7, 4 * CHUNK)
    cold, _ = hybrid_engine.one(p, salt=cold_salt())
    hybrid_engine.one(p)  # stored
    out, cached = hybrid_engine.one(p)
    assert cached == 3 * CHUNK
    assert out == cold


def test_a_failed_load_of_a_hybrid_model_recomputes_the_request(hybrid_engine: RealEngine) -> None:
    """vLLM cannot take a per-block load failure from a model with several groups (it raises);
    kvtier reports the request as failed_recving, and vLLM recomputes it."""
    check_a_failed_load_recomputes(hybrid_engine, prompt(5, 230), (230 // CHUNK) * CHUNK,
                                   wait_s=0.7)
