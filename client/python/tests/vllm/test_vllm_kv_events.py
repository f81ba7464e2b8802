"""The KV cache events kvtier's vLLM connector publishes for what the workers stored, and its
relay of kvtierd's own evictions as BlockRemoved (vLLM's real Scheduler, a real kvtierd)."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVCacheEvent
from vllm.v1.outputs import KVConnectorOutput

import kvtier
from connector_helpers import (BLOCKS_PER_CHUNK, CHUNK, dram_chunks, make, prompt,
                               scheduler_connector, stored, vllm_hashes)
from engine_harness import BLOCK_SIZE, Engine
from kvtier.integrations import _vllm_removals
from kvtier.integrations.vllm import KvtierConnectorMetadata, KvtierKVEvents
from kvtierd_process import KvtierdProcess


def test_kv_events_announce_a_store_with_vllms_own_block_hashes(
        kvtierd: KvtierdProcess, model_dir: str, engines: list[Engine]) -> None:
    tokens = prompt(21, 3 * CHUNK + 10)
    a = make(engines, model_dir, kvtierd, kv_events=True)
    request = a.add("a", tokens)
    step = a.step()
    assert dram_chunks(kvtierd) == 3

    [event] = stored(step.published, "CPU")
    assert event.block_hashes == vllm_hashes(request, 3 * BLOCKS_PER_CHUNK)
    # The same hashes vLLM's own block pool announced for the request's GPU blocks.
    gpu = [h for e in stored(step.published, "GPU") for h in e.block_hashes]
    assert event.block_hashes == gpu[:3 * BLOCKS_PER_CHUNK]
    assert event.parent_block_hash is None
    assert event.token_ids == tokens[:3 * CHUNK]  # full chunks only, not the 10-token tail
    assert event.block_size == BLOCK_SIZE
    assert (event.lora_id, event.lora_name, event.group_idx) == (None, None, 0)
    # The group's spec, as vLLM's own events for it say (vLLM 0.33's fields for routers).
    gpu_specs = {(e.kv_cache_spec_kind, e.kv_cache_spec_sliding_window)
                 for e in stored(step.published, "GPU")}
    assert gpu_specs == {("full_attention", None)}
    assert (event.kv_cache_spec_kind, event.kv_cache_spec_sliding_window) == ("full_attention",
                                                                              None)
    assert event.locality == "LOCAL"
    # The scheduler took them for this step's batch: nothing is left to take.
    assert list(scheduler_connector(a).take_events()) == []


def test_kv_events_chain_the_stores_of_a_chunked_prefill(
        kvtierd: KvtierdProcess, model_dir: str, engines: list[Engine]) -> None:
    tokens = prompt(22, 4 * CHUNK + 2)
    a = make(engines, model_dir, kvtierd, kv_events=True, max_batched_tokens=48)
    request = a.add("a", tokens)
    events: list[BlockStored] = []
    for _ in range(3):  # 48 tokens a step: chunk 0, then chunks 1 and 2, then chunk 3
        events += stored(a.step().published, "CPU")
    assert [len(e.block_hashes) for e in events] == [1 * BLOCKS_PER_CHUNK,
                                                    2 * BLOCKS_PER_CHUNK,
                                                    1 * BLOCKS_PER_CHUNK]
    hashes = vllm_hashes(request, 4 * BLOCKS_PER_CHUNK)
    assert [h for e in events for h in e.block_hashes] == hashes
    assert [t for e in events for t in e.token_ids] == tokens[:4 * CHUNK]
    # Each store's parent is the block before its first one.
    assert [e.parent_block_hash for e in events] == [None, hashes[1], hashes[5]]


def test_kv_events_a_store_after_a_partial_hit_announces_the_loaded_chunks_too(
        kvtierd: KvtierdProcess, model_dir: str, engines: list[Engine]) -> None:
    """kvtier's StoreResult does not say which chunks it already held: a store that committed
    every chunk announces them all (see the connector's docstring)."""
    shared = prompt(23, 2 * CHUNK)
    a = make(engines, model_dir, kvtierd, kv_events=True)
    a.add("a", shared + prompt(24, 5))
    a.step()
    b = make(engines, model_dir, kvtierd, kv_events=True)
    tokens = shared + prompt(25, CHUNK + 3)
    request = b.add("b", tokens)
    step = b.step()
    assert step.computed["b"] == (2 * CHUNK, len(tokens))  # loaded the two shared chunks
    [event] = stored(step.published, "CPU")
    assert event.block_hashes == vllm_hashes(request, 3 * BLOCKS_PER_CHUNK)
    assert event.token_ids == tokens[:3 * CHUNK]


def test_kv_events_relay_kvtierds_evictions_of_announced_chunks_as_block_removed(
        model_dir: str, engines: list[Engine], tmp_path: Path) -> None:
    """kvtierd_events names kvtierd's own events endpoint: the scheduler relays the DRAM
    removals of the chunks it announced, with vLLM's block hashes, and nothing of chunks it
    never announced (another client's)."""
    endpoint = f"ipc://{tmp_path}/events"
    with KvtierdProcess(extra_args=["--events-address", endpoint]) as daemon:
        a = make(engines, model_dir, daemon, kv_events=True, extra={"kvtierd_events": endpoint})
        request = a.add("a", prompt(27, 2 * CHUNK + 5))
        [event] = stored(a.step().published, "CPU")
        assert event.block_hashes == vllm_hashes(request, 2 * BLOCKS_PER_CHUNK)
        with kvtier.Client.connect(socket=daemon.socket, deadline_ms=2000) as other:
            ns = other.open_namespace(model_id="someone-else", num_layers=1, kv_dtype="fp16",
                                      num_kv_heads=1, head_dim=8, chunk_tokens=CHUNK)
            assert other.store(ns, prompt(28, CHUNK), np.zeros((1, 2, CHUNK, 1, 8), np.float16)
                               ).stored_chunks == 1
        assert sum(int(t["removed"]) for t in daemon.admin().evict(all=True).values()) >= 3
        removed: list[BlockRemoved] = []
        deadline = time.monotonic() + 10
        while sum(len(e.block_hashes) for e in removed) < len(event.block_hashes):
            assert time.monotonic() < deadline, f"relayed so far: {removed}"
            removed += [e for e in scheduler_connector(a).take_events()
                        if isinstance(e, BlockRemoved)]
            time.sleep(0.02)
        time.sleep(0.2)  # anything more kvtierd published comes too
        removed += [e for e in scheduler_connector(a).take_events() if isinstance(e, BlockRemoved)]
        assert sorted(h for e in removed for h in e.block_hashes) == sorted(event.block_hashes)
        assert {(e.medium, e.group_idx) for e in removed} == {("CPU", 0)}
    with pytest.raises(ValueError, match="kvtierd_events 'tcp:/nowhere' is not a ZMQ endpoint"):
        make(engines, model_dir, daemon, kv_events=True, extra={"kvtierd_events": "tcp:/nowhere"})


def test_kv_events_relay_warns_once_when_nothing_listens_at_its_endpoint(
        kvtierd: KvtierdProcess, model_dir: str, engines: list[Engine], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """kvtierd_events naming an address where nothing listens (a typo, another port) is no
    error, as kvtierd may start later; after CONNECT_WARN_S the relay says so, once, naming the
    address. A kvtierd that listens but publishes nothing (the engine's stores are of chunks it
    holds already) gets no warning; kvtierd_events with vLLM's KV events off gets one."""
    monkeypatch.setattr(_vllm_removals, "CONNECT_WARN_S", 0.5)
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    log = logging.getLogger("vllm.kvtier_connector")
    log.addHandler(handler)

    def warnings() -> list[str]:
        return [r.getMessage() for r in records if r.levelno == logging.WARNING]

    try:
        nobody = f"ipc://{tmp_path}/nobody"
        a = make(engines, model_dir, kvtierd, kv_events=True, extra={"kvtierd_events": nobody})
        scheduler_connector(a).take_events()
        assert not warnings(), "warned before CONNECT_WARN_S"
        time.sleep(0.7)
        for _ in range(3):
            scheduler_connector(a).take_events()
        [warned] = warnings()
        assert nobody in warned and "--events-address" in warned, warned
        records.clear()

        endpoint = f"ipc://{tmp_path}/events"
        tokens = prompt(29, 2 * CHUNK + 5)
        with KvtierdProcess(extra_args=["--events-address", endpoint]) as daemon:
            make(engines, model_dir, daemon).add("first", tokens)
            engines[-1].step()  # kvtierd holds the prefix before the relay below connects
            b = make(engines, model_dir, daemon, kv_events=True,
                     extra={"kvtierd_events": endpoint})
            b.add("b", tokens)
            assert b.step().computed["b"] == (2 * CHUNK, len(tokens))
            time.sleep(0.7)
            for _ in range(3):
                scheduler_connector(b).take_events()
            assert not warnings(), "warned though kvtierd listens at the address"
            make(engines, model_dir, daemon, kv_events=False, extra={"kvtierd_events": endpoint})
            [warned] = warnings()
            assert "KV cache events are off" in warned, warned
    finally:
        log.removeHandler(handler)


def test_kv_events_disabled_record_nothing(
        kvtierd: KvtierdProcess, model_dir: str, engines: list[Engine]) -> None:
    tokens = prompt(26, 3 * CHUNK + 1)
    a = make(engines, model_dir, kvtierd)
    a.add("a", tokens)
    step = a.step()
    assert dram_chunks(kvtierd) == 3  # stored, but not announced
    meta = step.output.kv_connector_metadata
    assert isinstance(meta, KvtierConnectorMetadata) and meta.saves
    assert all(save.stored_blocks is None for save in meta.saves)  # no hashes sent
    assert step.worker_events == [None]
    assert step.published == []
    connector = scheduler_connector(a)
    assert connector._event_requests == {} and connector._published == []
    assert list(connector.take_events()) == []


@pytest.mark.parametrize("when", ["before_load", "before_commit"])
def test_kv_events_a_failed_store_announces_nothing(
        kvtierd: KvtierdProcess, model_dir: str, engines: list[Engine], when: str) -> None:
    tokens = prompt(27, 3 * CHUNK + 4)
    a = make(engines, model_dir, kvtierd, kv_events=True)
    a.add("a", tokens)
    kill: dict[str, Callable[[], None]] = {f"kill_{when}": kvtierd.kill9}
    step = a.step(**kill)
    assert step.computed["a"] == (0, len(tokens))
    assert stored(step.published, "GPU")  # events are on: vLLM announced its own blocks
    assert stored(step.published, "CPU") == []
    assert step.worker_events == [[]]  # the worker reported, with nothing stored
    assert list(scheduler_connector(a).take_events()) == []


def test_kv_events_with_two_ranks_publish_only_what_both_stored(
        kvtierd: KvtierdProcess, model_dir: str, engines: list[Engine]) -> None:
    with KvtierdProcess() as rank1:
        a = make(engines, model_dir, kvtierd, kv_events=True,
                 worker_sockets=[kvtierd.socket, rank1.socket])
        r1 = prompt(28, 2 * CHUNK + 3)
        request = a.add("r1", r1)
        step = a.step()
        assert dram_chunks(kvtierd) == dram_chunks(rank1) == 2
        assert step.worker_events[0] == step.worker_events[1] != []
        [event] = stored(step.published, "CPU")
        assert event.block_hashes == vllm_hashes(request, 2 * BLOCKS_PER_CHUNK)

        # Rank 1's daemon dies before its commit: rank 0 stored and reported the chunks, but
        # a chunk counts as stored only when every rank stored its shard.
        r2 = prompt(29, 2 * CHUNK + 3)
        a.add("r2", r2)
        step = a.step(kill_before_commit=rank1.kill9)
        assert step.computed["r2"] == (0, len(r2))
        assert dram_chunks(kvtierd) == 4
        assert [len(events or []) for events in step.worker_events] == [1, 0]
        assert stored(step.published, "CPU") == []
        assert list(scheduler_connector(a).take_events()) == []


def test_kv_events_of_two_workers_are_kept_per_step(
        kvtierd: KvtierdProcess, model_dir: str, engines: list[Engine]) -> None:
    """update_connector_output keeps what every worker of that output reported; events from
    two outputs never add up to a quorum, and take_events empties what it returns."""
    a = make(engines, model_dir, kvtierd, kv_events=True)
    connector = scheduler_connector(a)
    e1 = BlockStored(block_hashes=[1, 2], parent_block_hash=None, token_ids=[5] * 32,
                     block_size=BLOCK_SIZE, lora_id=None, medium="CPU", lora_name=None)
    e2 = BlockStored(block_hashes=[3, 4], parent_block_hash=2, token_ids=[6] * 32,
                     block_size=BLOCK_SIZE, lora_id=None, medium="CPU", lora_name=None)

    def merged(*per_worker: list[KVCacheEvent]) -> KVConnectorOutput:
        events = KvtierKVEvents(num_workers=1)  # as vLLM's executor merges them
        events.add_events(list(per_worker[0]))
        for other in per_worker[1:]:
            events.add_events(list(other))
            events.increment_workers(1)
        return KVConnectorOutput(kv_cache_events=events)

    connector.update_connector_output(merged([e1, e2], [e1]))  # e2: rank 1 failed
    connector.update_connector_output(merged([], [e2]))  # e2 on rank 1 only, a step later
    assert list(connector.take_events()) == [e1]
    assert list(connector.take_events()) == []
