"""kvtier under a real vLLM engine serving a Mamba hybrid: a tiny random-weight
Granite-4.0-H-shaped model (Mamba2, attention, Mamba2, attention). vLLM's hybrid allocator
gives it a Mamba group (in "align" mode, as prefix caching is on) and a full-attention group;
kvtier stores the attention KV in chunks and each Mamba state vLLM offers at a chunk boundary
beside it (docs/HYBRID.md), and a hit ends where a state was stored. Outputs are compared with
a cold recompute (a cache salt used once)."""

from __future__ import annotations

from kvtierd_process import KvtierdProcess
from real_engine import (
    RealEngine,
    check_a_failed_load_recomputes,
    cold_context_sensitive,
    cold_salt,
    prompt,
)
from tiny_granite import write_tiny_granite

CHUNK = 64  # vLLM raises this model's block size to 64 (a page must hold a Mamba state)
WRITE_MODEL = write_tiny_granite
EXTRA = {"chunk_tokens": CHUNK, "model_id": "tiny-granite", "deadline_ms": 2000}


def test_a_mamba_hybrid_loads_its_state_and_equals_cold(hybrid_engine: RealEngine,
                                                         hybrid_kvtierd: KvtierdProcess) -> None:
    log = hybrid_engine.log()
    assert "Turning off hybrid kv cache manager" not in log
    assert "#kv-groups:mambax2,full_attentionx2/" in log, \
        "the engine did not run with a Mamba group and a full-attention group"
    p = prompt(2, 300)
    cold = cold_context_sensitive(hybrid_engine, p)
    first, cached_first = hybrid_engine.one(p)  # stores the KV, and the state vLLM offers (256)
    assert cached_first == 0 and first == cold
    before = int(hybrid_kvtierd.admin().stats()["hit_tokens"])
    again, cached = hybrid_engine.one(p)
    assert cached == 256, "the hit does not end at the stored state"
    assert again == cold
    assert int(hybrid_kvtierd.admin().stats()["hit_tokens"]) - before >= cached
    q = p[:256] + prompt(3, 60)  # shares the prefix that ends at the state
    cold_q, _ = hybrid_engine.one(q, salt=cold_salt())
    out_q, cached_q = hybrid_engine.one(q)
    assert cached_q == 256 and out_q == cold_q


def test_a_hit_ends_at_the_last_stored_state(hybrid_engine: RealEngine) -> None:
    """vLLM 0.33 keeps (and offers) a prompt's Mamba state at its last block boundary (by
    default; prefix_cache_retention_interval adds more): a prompt that shares 200 tokens with
    a stored one finds three chunks of attention KV but no state within them, so it loads
    nothing (the KV alone would resume the Mamba layers from the wrong state)."""
    p = prompt(4, 300)
    hybrid_engine.one(p)  # stored: KV chunks 0..3, the state at 256
    r = p[:200] + prompt(5, 90)
    cold_r, _ = hybrid_engine.one(r, salt=cold_salt())
    out_r, cached_r = hybrid_engine.one(r)
    assert cached_r == 0 and out_r == cold_r
    out_r, cached_r = hybrid_engine.one(r)  # r's own state, at 256, is stored now
    assert cached_r == 256 and out_r == cold_r


def test_a_failed_load_of_a_mamba_hybrid_recomputes_the_request(
        hybrid_engine: RealEngine) -> None:
    check_a_failed_load_recomputes(hybrid_engine, prompt(6, 230), 192, wait_s=3.0)  # state: 192
