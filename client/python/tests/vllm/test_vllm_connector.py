"""kvtier's vLLM connector driven by vLLM's real Scheduler (requests, scheduler output,
connector metadata) and a worker-side connector over CPU tensors that vLLM's own
allocate_kv_cache laid out, on the host-emulation backend, through a real kvtierd."""

from __future__ import annotations

from typing import Iterator

import pytest
import torch
from vllm.v1.kv_cache_layout import KVCacheLayout

import kvtier
from engine_harness import BLOCK_SIZE, Engine
from kvtierd_process import KvtierdProcess

CHUNK = 32


def prompt(seed: int, n: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 32000, (n,), generator=g).tolist()


def dram_chunks(daemon: KvtierdProcess) -> int:
    return [t for t in daemon.admin().stats()["tiers"] if t["name"] == "dram"][0]["chunks"]


@pytest.fixture
def engines(kvtierd: KvtierdProcess, model_dir: str) -> Iterator[list[Engine]]:
    made: list[Engine] = []
    yield made
    for e in made:
        e.close()


def make(engines: list[Engine], model_dir: str, daemon: KvtierdProcess, **kw: object) -> Engine:
    e = Engine(model_dir, daemon.socket, chunk_tokens=CHUNK, **kw)  # type: ignore[arg-type]
    engines.append(e)
    return e


@pytest.mark.parametrize("layout", [KVCacheLayout.LBHNC, KVCacheLayout.LBNHC,
                                    KVCacheLayout.BLHNC],
                         ids=["HND", "NHD", "cross_layer"])
def test_second_engine_loads_what_the_first_stored_bit_exact(
        kvtierd: KvtierdProcess, model_dir: str, engines: list[Engine],
        layout: KVCacheLayout) -> None:
    tokens = prompt(1, 3 * CHUNK + 10)
    a = make(engines, model_dir, kvtierd)
    a.add("a", tokens)
    step = a.step()
    assert step.computed["a"] == (0, len(tokens))
    assert dram_chunks(kvtierd) == 3  # full chunks only; the 10-token tail is not stored

    b = make(engines, model_dir, kvtierd, layout=layout)
    b.add("b", tokens)
    step = b.step()
    assert step.computed["b"] == (3 * CHUNK, len(tokens))  # the prefix was not recomputed
    assert step.load_errors == set()
    assert b.kv_matches("b", tokens, range(len(tokens)))  # loaded and computed, bit for bit


def test_mla_latent_cache_round_trip(kvtierd: KvtierdProcess, model_dir: str,
                                     engines: list[Engine]) -> None:
    """MLAAttentionSpec: vLLM lays each layer out as [num_blocks, 1, block_size, latent]."""
    tokens = prompt(12, 2 * CHUNK + 9)
    a = make(engines, model_dir, kvtierd, mla=True)
    assert a.kv_caches[next(iter(a.kv_caches))].shape[1] == 1
    a.add("a", tokens)
    a.step()
    b = make(engines, model_dir, kvtierd, mla=True, layout=KVCacheLayout.BLHNC)
    b.add("b", tokens)
    step = b.step()
    assert step.computed["b"] == (2 * CHUNK, len(tokens))
    assert b.kv_matches("b", tokens, range(len(tokens)))
    # An MHA engine of the same model never sees the MLA chunks (another namespace).
    c = make(engines, model_dir, kvtierd)
    c.add("c", tokens)
    assert c.step().computed["c"] == (0, len(tokens))


def test_partial_hit_and_a_prompt_shorter_than_a_chunk(
        kvtierd: KvtierdProcess, model_dir: str, engines: list[Engine]) -> None:
    shared = prompt(2, 2 * CHUNK)
    a = make(engines, model_dir, kvtierd)
    a.add("a", shared + prompt(3, 5))
    a.step()
    assert dram_chunks(kvtierd) == 2

    b = make(engines, model_dir, kvtierd)
    other = shared + prompt(4, 50)
    b.add("b", other)
    step = b.step()
    assert step.computed["b"] == (2 * CHUNK, len(other))
    assert b.kv_matches("b", other, range(len(other)))

    short = prompt(5, CHUNK - 12)
    b.add("short", short)
    step = b.step()
    assert step.computed["short"] == (0, len(short))
    assert dram_chunks(kvtierd) == 2 + 1  # b stored its third chunk; `short` stores nothing


def test_chunked_prefill_stores_only_what_each_step_computed(
        kvtierd: KvtierdProcess, model_dir: str, engines: list[Engine]) -> None:
    tokens = prompt(6, 4 * CHUNK + 2)
    a = make(engines, model_dir, kvtierd, max_batched_tokens=48)
    a.add("a", tokens)
    seen = []
    while True:
        step = a.step()
        if "a" not in step.computed:
            break
        seen.append((step.computed["a"], dram_chunks(kvtierd)))
        if step.computed["a"][1] >= len(tokens):
            break
    # 48 tokens a step: chunks complete at 32, 64 and 96 (step 2), 128 (step 3).
    assert seen == [((0, 48), 1), ((48, 96), 3), ((96, 130), 4)]

    b = make(engines, model_dir, kvtierd)
    b.add("b", tokens)
    step = b.step()
    assert step.computed["b"] == (4 * CHUNK, len(tokens))
    assert b.kv_matches("b", tokens, range(len(tokens)))


def test_daemon_killed_before_the_load_reports_the_blocks_for_recompute(
        kvtierd: KvtierdProcess, model_dir: str, engines: list[Engine]) -> None:
    tokens = prompt(7, 3 * CHUNK + 3)
    a = make(engines, model_dir, kvtierd)
    a.add("a", tokens)
    a.step()

    b = make(engines, model_dir, kvtierd)
    b.add("b", tokens)
    step = b.step(kill_before_load=kvtierd.kill9)  # the scheduler promised 96 tokens
    assert step.computed["b"] == (3 * CHUNK, len(tokens))
    promised_blocks = set(b.block_ids("b")[:3 * CHUNK // BLOCK_SIZE])
    assert step.load_errors == promised_blocks
    # Nothing from the cache was written into the promised blocks: they are still zero.
    for cache in b.kv_caches.values():
        assert not cache[sorted(promised_blocks)].any()
    # vLLM reschedules the request from its first failed block and computes the prefix.
    step = b.step()
    assert step.computed["b"][0] == 0
    assert b.kv_matches("b", tokens, range(step.computed["b"][1]))


def test_two_requests_sharing_a_prefix_in_one_batch(
        kvtierd: KvtierdProcess, model_dir: str, engines: list[Engine]) -> None:
    shared = prompt(8, 2 * CHUNK)
    r1, r2 = shared + prompt(9, 40), shared + prompt(10, 20)
    # Nothing in kvtier: r1 computes everything; r2 shares r1's blocks through vLLM's own
    # prefix cache in the same step. The shared chunks are stored once.
    a = make(engines, model_dir, kvtierd)
    a.add("r1", r1)
    a.add("r2", r2)
    step = a.step()
    assert step.computed == {"r1": (0, len(r1)), "r2": (2 * CHUNK, len(r2))}
    assert dram_chunks(kvtierd) == 2 + 1  # the shared two, and r1's third chunk
    assert a.kv_matches("r2", r2, range(len(r2)))

    # In kvtier: a second engine loads r1's prefix, and r2 reads the shared blocks that this
    # same step's load fills.
    b = make(engines, model_dir, kvtierd)
    b.add("r1", r1)
    b.add("r2", r2)
    step = b.step()
    assert step.computed == {"r1": (3 * CHUNK, len(r1)), "r2": (2 * CHUNK, len(r2))}
    assert b.kv_matches("r1", r1, range(len(r1)))
    assert b.kv_matches("r2", r2, range(len(r2)))


def test_cache_salt_isolates_tenants(
        kvtierd: KvtierdProcess, model_dir: str, engines: list[Engine]) -> None:
    tokens = prompt(11, 2 * CHUNK + 1)
    a = make(engines, model_dir, kvtierd)
    a.add("a", tokens, cache_salt="tenant-a")
    a.step()
    b = make(engines, model_dir, kvtierd)
    b.add("b", tokens, cache_salt="tenant-b")
    assert b.step().computed["b"] == (0, len(tokens))
    b.add("a2", tokens, cache_salt="tenant-a")
    assert b.step().computed["a2"] == (2 * CHUNK, len(tokens))


def test_bad_extra_config_is_refused_with_its_name(kvtierd: KvtierdProcess,
                                                    model_dir: str) -> None:
    with pytest.raises(ValueError, match="chunk_tokens 40 is not a multiple"):
        Engine(model_dir, kvtierd.socket, chunk_tokens=40)
    with pytest.raises(ValueError, match="unknown kv_connector_extra_config keys"):
        Engine(model_dir, kvtierd.socket, extra={"sokcet": "/tmp/x"})
    with pytest.raises(kvtier.InvalidArgument):
        Engine(model_dir, "/nonexistent-dir/kvtierd.sock" + "x" * 200)


def test_blocks_of_the_engines_own_prefix_hit_are_left_alone(
        kvtierd: KvtierdProcess, model_dir: str, engines: list[Engine]) -> None:
    """The engine's prefix cache holds 48 tokens (3 blocks), kvtier 96 (3 chunks of 32): the
    chunk straddling the engine's hit is copied around its blocks, never into them."""
    tokens = prompt(13, 3 * CHUNK + 7)
    a = make(engines, model_dir, kvtierd)
    a.add("a", tokens)
    a.step()

    b = make(engines, model_dir, kvtierd)
    b.add("r0", tokens[:48] + prompt(14, 20))  # fills B's prefix cache with 3 blocks
    b.step()
    owned = b.block_ids("r0")[:3]
    marker = torch.full_like(b.kv_caches[next(iter(b.kv_caches))][owned[2]], 77.0)
    for cache in b.kv_caches.values():
        cache[owned[2]] = marker  # what the engine itself holds in its third block
    b.add("r1", tokens)
    step = b.step()
    assert step.computed["r1"] == (3 * CHUNK, len(tokens))
    assert b.block_ids("r1")[:3] == owned  # vLLM's own hit: the same blocks
    for cache in b.kv_caches.values():
        assert torch.equal(cache[owned[2]], marker)  # not overwritten by the load
    assert b.kv_matches("r1", tokens, range(48, len(tokens)))


def test_a_cache_salt_kvtier_cannot_name_is_hashed_not_fatal(
        kvtierd: KvtierdProcess, model_dir: str, engines: list[Engine]) -> None:
    tokens = prompt(15, 2 * CHUNK + 1)
    a = make(engines, model_dir, kvtierd)
    a.add("a", tokens, cache_salt="tenant|a")  # '|' is not allowed in a namespace field
    a.step()
    b = make(engines, model_dir, kvtierd)
    b.add("b", tokens, cache_salt="tenant|a")
    assert b.step().computed["b"] == (2 * CHUNK, len(tokens))
    b.add("c", tokens, cache_salt="tenant|b")
    assert b.step().computed["c"] == (0, len(tokens))
