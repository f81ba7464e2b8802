"""kvtier's vLLM connector driven by vLLM's real Scheduler (requests, scheduler output,
connector metadata) and a worker-side connector over CPU tensors that vLLM's own
allocate_kv_cache laid out, on the host-emulation backend, through a real kvtierd (the KV
cache events it publishes: test_vllm_kv_events.py)."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.lora.request import LoRARequest
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,
                                        MambaSpec, SlidingWindowSpec)
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.outputs import KVConnectorOutput

import kvtier
from connector_helpers import CHUNK, dram_chunks, make, prompt, scheduler_connector
from engine_harness import BLOCK_SIZE, LAYER_NAMES, Engine
from kvtier.integrations._vllm_groups import group_layer_names, namespace_spec
from kvtier.integrations._vllm_mamba import MambaStates
from kvtier.integrations._vllm_plan import _LoadSpec, _Settings, _StateSave, _Tracker
from kvtier.integrations.vllm import KvtierConnector, KvtierConnectorMetadata
from kvtierd_process import KvtierdProcess
from redis_cluster import RedisCluster

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


def test_a_request_whose_asynchronous_load_failed_is_not_loaded_again(
        kvtierd: KvtierdProcess, model_dir: str, engines: list[Engine]) -> None:
    """vLLM recomputes a request its connector reported in failed_recving, asking the connector
    for its hit again: a second load of the same prefix could fail the same way, forever (a
    hybrid engine once looped so 349,000 times in 30 s). Other requests for that prefix still
    hit, and the request's id is forgotten when it finishes."""
    tokens = prompt(31, 3 * CHUNK + 5)
    a = make(engines, model_dir, kvtierd)
    a.add("a", tokens)
    a.step()
    b = make(engines, model_dir, kvtierd)
    assert b.matched(b.request("x", tokens)) == 3 * CHUNK
    scheduler_connector(b).update_connector_output(KVConnectorOutput(failed_recving={"y"}))
    assert b.matched(b.request("y", tokens)) == 0
    assert b.matched(b.request("z", tokens)) == 3 * CHUNK
    assert b.matched(b.request("y", tokens)) == 3 * CHUNK  # a new request under the old id


def test_the_daemon_counts_an_engine_request_once_and_only_what_it_served(
        kvtierd: KvtierdProcess, model_dir: str, engines: list[Engine]) -> None:
    tokens = prompt(41, 3 * CHUNK + 10)
    a = make(engines, model_dir, kvtierd)
    a.add("a", tokens)
    a.step()
    before = kvtierd.admin().stats()
    b = make(engines, model_dir, kvtierd)
    b.add("b", tokens)  # the scheduler's prefetch, its lookups, the worker's leased load
    assert b.step().computed["b"] == (3 * CHUNK, len(tokens))
    after = kvtierd.admin().stats()
    assert after["lookups"] - before["lookups"] >= 1
    assert after["lookup_tokens"] - before["lookup_tokens"] == len(tokens)
    assert after["hit_tokens"] - before["hit_tokens"] == 3 * CHUNK


def test_a_kv_consumer_loads_but_stores_nothing_of_its_own(
        kvtierd: KvtierdProcess, model_dir: str, engines: list[Engine]) -> None:
    """Prefill/decode disaggregation: the producer (prefill) stores, the consumer (decode)
    loads what it stored and stores nothing of its own; a producer loads too."""
    tokens = prompt(43, 3 * CHUNK + 10)
    producer = make(engines, model_dir, kvtierd, kv_role="kv_producer")
    producer.add("p", tokens)
    producer.step()
    assert dram_chunks(kvtierd) == 3
    consumer = make(engines, model_dir, kvtierd, kv_role="kv_consumer")
    consumer.add("c", tokens)
    step = consumer.step()
    assert step.computed["c"] == (3 * CHUNK, len(tokens))  # loaded, not recomputed
    assert consumer.kv_matches("c", tokens, range(len(tokens)))
    own = prompt(44, 2 * CHUNK + 3)
    consumer.add("own", own)
    assert consumer.step().computed["own"] == (0, len(own))
    assert dram_chunks(kvtierd) == 3, "the consumer stored its own prompt"
    again = make(engines, model_dir, kvtierd, kv_role="kv_producer")
    again.add("again", tokens)
    assert again.step().computed["again"] == (3 * CHUNK, len(tokens))  # a producer loads


def test_the_workers_counters_reach_vllms_prometheus_metrics(
        kvtierd: KvtierdProcess, model_dir: str, engines: list[Engine]) -> None:
    """build_prom_metrics: vLLM's Prometheus logger (KVConnectorProm, with prometheus_client's
    real classes) observes what the scheduler got from the workers of a step."""
    from prometheus_client import REGISTRY
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorProm
    tokens = prompt(45, 3 * CHUNK + 10)
    a = make(engines, model_dir, kvtierd)
    a.add("a", tokens)
    b = make(engines, model_dir, kvtierd)
    prom = KVConnectorProm(b.vllm_config, ["model_name", "engine"], {0: ["tiny", "0"]})
    labels = {"model_name": "tiny", "engine": "0"}
    try:
        stats = a.step().kv_output.kv_connector_stats
        assert stats is not None
        prom.observe(stats.to_dict(), 0)
        assert REGISTRY.get_sample_value("vllm:kvtier_stored_tokens_total", labels) == 3 * CHUNK
        b.add("b", tokens)
        stats = b.step().kv_output.kv_connector_stats
        assert stats is not None
        prom.observe(stats.to_dict(), 0)
        assert REGISTRY.get_sample_value("vllm:kvtier_loaded_tokens_total", labels) == 3 * CHUNK
        assert REGISTRY.get_sample_value("vllm:kvtier_load_error_blocks_total", labels) == 0
    finally:
        for collector in list(REGISTRY._collector_to_names):
            if any(n.startswith("vllm:kvtier_") for n in REGISTRY._collector_to_names[collector]):
                REGISTRY.unregister(collector)


def test_a_connector_reset_serves_this_engine_nothing_stored_before(
        kvtierd: KvtierdProcess, model_dir: str, engines: list[Engine]) -> None:
    """vLLM's reset_prefix_cache(reset_connector=True), as after weights updated in place: the
    engine loads nothing kvtier held before; what it computes after is stored and loaded
    again; another engine (not reset) still loads the old KV."""
    tokens = prompt(46, 3 * CHUNK + 10)
    a = make(engines, model_dir, kvtierd)
    a.add("a", tokens)
    a.step()
    assert a.scheduler.reset_prefix_cache(reset_connector=True)
    a.add("after", tokens)
    assert a.step().computed["after"] == (0, len(tokens)), "served KV stored before the reset"
    assert a.scheduler.reset_prefix_cache()  # vLLM's own cache only: kvtier serves it now
    a.add("again", tokens)
    assert a.step().computed["again"] == (3 * CHUNK, len(tokens))
    assert a.kv_matches("again", tokens, range(len(tokens)))
    b = make(engines, model_dir, kvtierd)
    b.add("b", tokens)
    assert b.step().computed["b"] == (3 * CHUNK, len(tokens))


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
    # A wait past the daemon's hold, or past what a Future can wait (OverflowError), is refused.
    for wait in (2001, 10**18):
        with pytest.raises(ValueError, match=r"prefetch_wait_ms \(\d+\) must not exceed "
                                             r"prefetch_deadline_ms \(2000\)"):
            Engine(model_dir, kvtierd.socket, extra={"prefetch_wait_ms": wait})
    for deadline in (600_001, 10**18):  # kvtierd refuses a Prefetch longer than 10 min
        with pytest.raises(ValueError, match=f"prefetch_deadline_ms must be at most 600000 "
                                             f"\\(10 min\\), not {deadline}"):
            Engine(model_dir, kvtierd.socket,
                   extra={"prefetch_deadline_ms": deadline, "prefetch_wait_ms": 20})
    for name, value in (("socket", 7), ("model_id", ["m"])):
        with pytest.raises(ValueError, match=re.escape(f"{name} must be a string, not {value!r}")):
            Engine(model_dir, kvtierd.socket, extra={name: value})
    with pytest.raises(kvtier.InvalidArgument):
        Engine(model_dir, "/nonexistent-dir/kvtierd.sock" + "x" * 200)


def test_kv_cache_groups_kvtier_cannot_store_are_refused_with_the_reason(
        kvtierd: KvtierdProcess, model_dir: str, engines: list[Engine]) -> None:
    """vLLM's hybrid allocator stays on with kvtier (SupportsHMA): full-attention and
    sliding-window groups share a namespace naming the grouping; what kvtier cannot store
    stops the engine at startup, naming the group."""
    config = make(engines, model_dir, kvtierd).vllm_config
    settings = _Settings.parse({"chunk_tokens": 2 * BLOCK_SIZE}, "m")
    heads = dict(block_size=BLOCK_SIZE, num_kv_heads=2, head_size=16, dtype=torch.float16)

    def groups(*specs: object) -> KVCacheConfig:
        return KVCacheConfig(num_blocks=8, kv_cache_tensors=[], kv_cache_groups=[
            KVCacheGroupSpec([f"model.layers.{i}.self_attn.attn"], s)  # type: ignore[arg-type]
            for i, s in enumerate(specs)])

    full = FullAttentionSpec(**heads)  # type: ignore[arg-type]
    spec = namespace_spec(config, groups(full, SlidingWindowSpec(**heads, sliding_window=32)),
                          settings, 0)
    assert spec["num_layers"] == 2
    assert re.search(r"#kv-groups:full_attentionx1,sliding_window@32x1/[0-9a-f]{16}$",
                     spec["model_id"]), spec["model_id"]
    swapped = namespace_spec(config, groups(SlidingWindowSpec(**heads, sliding_window=32), full),
                             settings, 0)
    assert swapped["model_id"] != spec["model_id"]  # another grouping: another namespace
    with pytest.raises(ValueError, match=r"chunk_tokens 32 exceeds the sliding window of KV "
                                         r"cache group 1 \(16 tokens\)"):
        namespace_spec(config, groups(full, SlidingWindowSpec(**heads, sliding_window=16)),
                       settings, 0)
    # A Mamba group is kept apart (_vllm_mamba): named in the grouping, not in the KV payload.
    mamba = MambaSpec(block_size=BLOCK_SIZE, shapes=((4, 4),), dtypes=(torch.float16,),
                      mamba_cache_mode="align")
    hybrid = groups(full, mamba)
    spec = namespace_spec(config, hybrid, settings, 0)
    assert spec["num_layers"] == 1
    assert re.search(r"#kv-groups:full_attentionx1,mambax1/", spec["model_id"]), spec["model_id"]
    states = MambaStates(hybrid, group_layer_names(hybrid))
    state_spec = states.namespace_spec(spec)
    assert state_spec["model_id"].startswith(spec["model_id"] + "#mamba-state:")
    assert state_spec["engine_keyed"] and states.row_bytes >= 4 * 4 * 2
    with pytest.raises(ValueError, match="kvtier stores it only in 'align' mode"):
        MambaStates(groups(full, dataclasses.replace(mamba, mamba_cache_mode="none")), [])
    with pytest.raises(ValueError, match="the model has no attention layers"):
        namespace_spec(config, groups(mamba), settings, 0)
    with pytest.raises(ValueError, match="KV cache group 1 differs from group 0"):
        namespace_spec(config, groups(full, FullAttentionSpec(
            block_size=BLOCK_SIZE, num_kv_heads=4, head_size=16, dtype=torch.float16)),
            settings, 0)


def test_mamba_states_are_saved_only_at_chunk_boundaries_every_mamba_group_offers() -> None:
    """vLLM hands off each Mamba group's state with its block (boundary_state_offloads); a save
    needs a chunk boundary within the prompt that every Mamba group offered with a real block.
    The state namespace's rows hold each layer's state bytes, padded to 16."""
    heads = dict(block_size=BLOCK_SIZE, num_kv_heads=2, head_size=16, dtype=torch.float16)
    mamba = MambaSpec(block_size=BLOCK_SIZE, shapes=((3, 10), (2, 4, 4)),
                      dtypes=(torch.float32, torch.float32), mamba_cache_mode="align")
    config = KVCacheConfig(num_blocks=8, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["model.layers.0.mixer"], mamba),
        KVCacheGroupSpec(["model.layers.1.self_attn.attn"],
                         FullAttentionSpec(**heads)),  # type: ignore[arg-type]
        KVCacheGroupSpec(["model.layers.2.mixer"], mamba)])
    states = MambaStates(config, group_layer_names(config))
    assert states.groups == [0, 2] and states.state_bytes == (30 + 32) * 4
    assert states.row_bytes == 256  # 248 bytes, padded to a multiple of 16
    chunk = 2 * BLOCK_SIZE
    tokens = list(range(3 * chunk + 5))
    trackers = {"r": _Tracker(tokens, [[], [], []], 0, "salt", None, ""),
                "s": _Tracker(tokens[:chunk], [[], [], []], 0, None, None, "")}
    offers = {"r": [(0, 5, chunk), (2, 6, chunk),            # saved
                    (0, 7, chunk + BLOCK_SIZE), (2, 8, chunk + BLOCK_SIZE),  # not a chunk end
                    (0, 9, 2 * chunk),                        # group 2 did not offer it
                    (0, 0, 3 * chunk), (2, 4, 3 * chunk)],    # the null block
              "s": [(0, 1, 2 * chunk), (2, 2, 2 * chunk)],   # past the prompt
              "gone": [(0, 3, chunk), (2, 4, chunk)]}        # a request not tracked
    assert states.saves(offers, trackers, chunk) == [
        _StateSave("r", tokens[:chunk], [5, 6], "salt", None, "")]
    big = MambaStates(KVCacheConfig(num_blocks=8, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["model.layers.0.mixer"], dataclasses.replace(
            mamba, shapes=((100_000,),), dtypes=(torch.float32,)))]), [["model.layers.0.mixer"]])
    spec = big.namespace_spec({"model_id": "m", "tp_rank": 0, "tp_size": 1})
    assert big.row_bytes >= 400_000 and spec["head_dim"] <= 4096  # kvtierd's bound on head_dim
    assert big.row_bytes == 16 * spec["num_kv_heads"] * spec["head_dim"]


def test_mamba_states_round_trip_through_kvtierd_with_groups_of_unequal_size(
        kvtierd: KvtierdProcess) -> None:
    """vLLM splits a model's Mamba layers into groups that may differ by a layer (Bamba: nine
    groups of 3 and one of 2); each layer's row is read from and written to its own group's
    block, bit for bit, and the state namespace's model id stays within kvtierd's 512 bytes
    however many groups name their layers in it."""
    mamba = MambaSpec(block_size=BLOCK_SIZE, shapes=((3, 10), (2, 4, 4)),
                      dtypes=(torch.float32, torch.float32), mamba_cache_mode="align")
    names = [[f"model.layers.{i}.mixer" for i in range(g, 29, 10)] for g in range(10)]
    config = KVCacheConfig(num_blocks=8, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(layers, mamba) for layers in names] + [KVCacheGroupSpec(
            ["model.layers.29.self_attn.attn"], FullAttentionSpec(  # type: ignore[arg-type]
                block_size=BLOCK_SIZE, num_kv_heads=2, head_size=16, dtype=torch.float16))])
    assert [len(n) for n in names] == [3] * 9 + [2]
    states = MambaStates(config, group_layer_names(config))
    gen = torch.Generator().manual_seed(3)
    caches = {n: torch.randint(-128, 128, (8, 1, 1, states.state_bytes), generator=gen,
                               dtype=torch.int8) for group in names for n in group}
    states.register(caches)
    kv_spec = {"model_id": "m" * 400, "num_layers": 1, "kv_dtype": "fp16",
               "chunk_tokens": 2 * BLOCK_SIZE, "layout": "mha", "num_kv_heads": 2,
               "head_dim": 16}
    state_spec = states.namespace_spec(kv_spec)
    assert len(state_spec["model_id"].encode()) <= 512
    tokens = list(range(4 * BLOCK_SIZE))
    with kvtier.Client.connect(socket=kvtierd.socket, deadline_ms=2000) as client:
        namespaces = (client.open_namespace(**kv_spec), client.open_namespace(**state_spec))
        saved = [1 + g % 7 for g in range(10)]  # each group's block
        stored = {n: caches[n][saved[g]].clone() for g, group in enumerate(names) for n in group}
        assert states.store(client, namespaces, _StateSave("r", tokens, saved, None, None,
                                                           "")) == "stored"
        assert states.store(client, namespaces, _StateSave("r", tokens, saved, None, None,
                                                           "")) == "held"
        target = [7 - g % 7 for g in range(10)]
        tables = [[0, target[g]] for g in range(10)] + [[0, 0]]
        assert states.load(client, namespaces, tokens, tables, 2 * BLOCK_SIZE, None, "")
        for g, group in enumerate(names):
            for n in group:
                assert torch.equal(caches[n][target[g]], stored[n]), (g, n)
        # A state ends a whole chunk: a prefix that is not one is never loaded.
        assert not states.load(client, namespaces, tokens[:3 * BLOCK_SIZE],
                               [[0, 0, 1]] * 11, BLOCK_SIZE, None, "")


def test_a_sliding_window_models_short_load_never_reports_the_null_block(
        kvtierd: KvtierdProcess, model_dir: str, engines: list[Engine]) -> None:
    """Every layer in one sliding-window group: loads stay synchronous, and a table's blocks
    before the window are vLLM's null block 0, which every request shares. A load that falls
    short reports the request's own blocks only (block 0 would fail other requests)."""
    config = make(engines, model_dir, kvtierd).vllm_config
    window = SlidingWindowSpec(block_size=BLOCK_SIZE, num_kv_heads=2, head_size=16,
                               dtype=torch.float16, sliding_window=CHUNK)
    worker = KvtierConnector(config, KVConnectorRole.WORKER, KVCacheConfig(
        num_blocks=16, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(LAYER_NAMES,
                                                                              window)]))
    try:
        worker.register_kv_caches({n: torch.zeros(16, 2, BLOCK_SIZE, 32, dtype=torch.float16)
                                   for n in LAYER_NAMES})
        # Nothing is cached: the 2 chunks promised (blocks 0, 0, 5, 6) all fall short.
        worker.bind_connector_metadata(KvtierConnectorMetadata(loads=[_LoadSpec(
            "r", prompt(29, 3 * CHUNK), [[0, 0, 5, 6, 7, 8]], 0, 2 * CHUNK, None, None)]))
        worker.start_load_kv(None)  # type: ignore[arg-type]
        assert worker.get_block_ids_with_load_errors() == {5, 6}
    finally:
        worker.clear_connector_metadata()
        worker.shutdown()


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


# ------------------------------------------------------------ what a chunk's key must hold

IMAGE_TOKEN = 7  # the placeholder id a multimodal processor repeats where an image goes


def image(identifier: str, offset: int, length: int) -> "MultiModalFeatureSpec":
    """An image item as vLLM's input processor hands it to the scheduler (its content hash in
    ``identifier``; the pixels are not needed by the scheduler)."""
    return MultiModalFeatureSpec(data=None, modality="image", identifier=identifier,
                                 mm_position=PlaceholderRange(offset=offset, length=length))


def test_a_multimodal_prompt_is_keyed_on_its_images_not_their_placeholder_ids(
        kvtierd: KvtierdProcess, model_dir: str, engines: list[Engine]) -> None:
    """Issue 32 item 2. A prompt's image is a run of one placeholder id whatever the picture:
    keyed on ids alone, a text prompt holding those ids, or the same text with another image,
    would hit the KV computed for the first image. Chunks that hold any part of an image are
    keyed on the image's content hash too; the chunks before the first image are shared."""
    tokens = prompt(40, 4 * CHUNK + 5)
    tokens[40:80] = [IMAGE_TOKEN] * 40  # chunks 1 and 2 hold the image (chunk 32 tokens)
    a = make(engines, model_dir, kvtierd)
    a.add("text", tokens)  # stored under the plain ids: four full chunks
    a.step()
    assert dram_chunks(kvtierd) == 4

    b = make(engines, model_dir, kvtierd)
    cat = b.request("cat", tokens, mm_features=[image("sha-of-cat", 40, 40)])
    assert b.matched(cat) == CHUNK, "an image request hit KV stored for placeholder ids"
    assert b.matched(b.request("plain", tokens)) == 4 * CHUNK  # the text itself still hits


def test_multimodal_keys_are_one_to_one_in_the_images_and_their_places(
        kvtierd: KvtierdProcess, model_dir: str, engines: list[Engine]) -> None:
    """The key ids of chunks with an image depend on the image and its offset; other chunks
    keep the prompt's ids; no key id of an image chunk is a vocabulary id."""
    a = make(engines, model_dir, kvtierd)
    c = scheduler_connector(a)
    tokens = prompt(41, 4 * CHUNK)
    tokens[40:80] = [IMAGE_TOKEN] * 40
    cat = c._key_tokens(tokens, [image("sha-of-cat", 40, 40)])
    dog = c._key_tokens(tokens, [image("sha-of-dog", 40, 40)])
    moved = c._key_tokens(tokens, [image("sha-of-cat", 41, 39)])
    assert cat[:CHUNK] == dog[:CHUNK] == tokens[:CHUNK]
    assert cat[3 * CHUNK:] == tokens[3 * CHUNK:]
    assert all(t < 0 for t in cat[CHUNK:3 * CHUNK])
    assert cat[CHUNK:2 * CHUNK] != dog[CHUNK:2 * CHUNK]
    assert cat[2 * CHUNK:3 * CHUNK] != dog[2 * CHUNK:3 * CHUNK]
    assert cat[CHUNK:3 * CHUNK] != moved[CHUNK:3 * CHUNK]
    assert cat == c._key_tokens(tokens, [image("sha-of-cat", 40, 40)])  # deterministic


def test_a_request_with_prompt_embeddings_runs_without_kvtier(
        kvtierd: KvtierdProcess, model_dir: str, engines: list[Engine]) -> None:
    """Prompt embeddings have no ids to key on (vLLM fills prompt_token_ids with zeros): such a
    request must neither hit nor be stored."""
    tokens = [0] * (2 * CHUNK + 1)
    a = make(engines, model_dir, kvtierd)
    a.add("zeros", tokens)
    a.step()
    assert dram_chunks(kvtierd) == 2
    embeds = a.request("embeds", tokens)
    embeds.prompt_embeds = torch.zeros(len(tokens), 8)
    assert a.matched(embeds) == 0


def write_adapter(directory: Path, seed: int) -> str:
    """A LoRA adapter folder as PEFT writes one (a config and its weights)."""
    directory.mkdir(parents=True)
    (directory / "adapter_config.json").write_text(json.dumps({"r": 8, "lora_alpha": 16}))
    g = torch.Generator().manual_seed(seed)
    save_file({"lora_A": torch.randn(8, 64, generator=g)},
              str(directory / "adapter_model.safetensors"))
    return str(directory)


def test_a_lora_name_pointed_at_other_weights_does_not_reuse_their_kv(
        kvtierd: KvtierdProcess, model_dir: str, engines: list[Engine],
        tmp_path: Path) -> None:
    """The KV of a LoRA request depends on the adapter's weights, not its name: a name that an
    operator re-points at a new adapter (or another engine serves with other weights) must
    miss; the same adapter copied elsewhere under the same name hits."""
    v1 = write_adapter(tmp_path / "v1", seed=1)
    v2 = write_adapter(tmp_path / "v2", seed=2)
    v1_copy = tmp_path / "v1-copy"
    shutil.copytree(v1, v1_copy)
    tokens = prompt(42, 2 * CHUNK + 3)
    a = make(engines, model_dir, kvtierd)
    a.add("a", tokens, lora_request=LoRARequest("support", 1, v1))
    a.step()
    assert dram_chunks(kvtierd) == 2

    b = make(engines, model_dir, kvtierd)
    assert b.matched(b.request("same", tokens, lora_request=LoRARequest("support", 1, v1))) \
        == 2 * CHUNK
    assert b.matched(b.request("copy", tokens,
                               lora_request=LoRARequest("support", 3, str(v1_copy)))) == 2 * CHUNK
    assert b.matched(b.request("repointed", tokens,
                               lora_request=LoRARequest("support", 2, v2))) == 0
    assert b.matched(b.request("base", tokens)) == 0


def test_a_slow_remote_tier_never_holds_up_the_scheduler(
        model_dir: str, engines: list[Engine], tmp_path: Path) -> None:
    """kvtierd asks its remote tier which chunks it holds during a prefetch. While the store
    does not answer, the scheduler must not wait on it: the connector answers "ask me again"
    (None), vLLM schedules the request at a later step, and it runs once the store answers.
    Before, the scheduler's step waited for the store (here 2 s; prefetch_wait_ms 20)."""
    (tmp_path / "nvme").mkdir()
    with RedisCluster(masters=3) as cluster:
        daemon = KvtierdProcess(workdir=tmp_path, extra_args=[
            "--nvme-path", str(tmp_path / "nvme"), "--nvme-bytes", "64MiB",
            "--remote", cluster.url, "--remote-timeout-ms", "10000"]).start()
        try:
            a = make(engines, model_dir, daemon, extra={"prefetch_wait_ms": 20})
            stalls = cluster.stall(2.0)
            time.sleep(0.3)  # the DEBUG SLEEPs have reached the masters
            tokens = prompt(41, 3 * CHUNK + 10)
            a.add("a", tokens)
            first = a.step()
            assert "a" not in first.computed, "the scheduler waited for the remote tier"
            assert all(p.poll() is None for p in stalls), "the stall ended during the step"
            deadline = time.monotonic() + 30
            while True:
                step = a.step()
                if "a" in step.computed:
                    break
                assert time.monotonic() < deadline, "the request was never scheduled"
                time.sleep(0.01)
            assert step.computed["a"] == (0, len(tokens))  # nothing was cached anywhere
            for p in stalls:
                p.wait(timeout=30)
        finally:
            daemon.stop()
