"""What the vLLM connector's workers report to vLLM: their counters (KvtierConnectorStats,
summed over workers by vLLM, and shown on vLLM's own /metrics by KvtierPromMetrics) and the
KV cache events of what kvtierd committed (KvtierKVEvents). Re-exported by
kvtier.integrations.vllm.

KV cache events (vLLM's ``--kv-events-config '{"enable_kv_cache_events": true}'``; without it
the connector records nothing):

- ``BlockStored``, ``medium="CPU"`` (kvtier's DRAM tier, where stores land; the medium vLLM's
  CPU offloading uses), one per committed store of a request's step: the vLLM blocks its
  chunks cover (``chunk_tokens / block_size`` blocks a chunk), with vLLM's own block hashes
  (``maybe_convert_block_hash`` of ``request.block_hashes``, as vLLM's block pool publishes
  them), ``parent_block_hash`` the hash of the block before the first (None at the prompt's
  start), the tokens covered, vLLM's ``block_size``, the request's LoRA (``lora_id``,
  ``lora_name``), one event per KV cache group of attention KV (``group_idx``; none for a
  Mamba group, whose states kvtier stores only at some boundaries) with its
  ``kv_cache_spec_kind`` and ``kv_cache_spec_sliding_window`` as vLLM's own events give them,
  and ``locality="LOCAL"``.
- A store is announced only when its commit succeeded with nothing dropped, and then all the
  chunks of that store: kvtier's ``StoreResult`` counts the chunks it stored now and those it
  already held, but does not say which are which, so chunks kvtier already held (e.g. the
  prefix this request loaded) are announced again; consumers deduplicate repeated
  announcements of a hash, as they must for vLLM's offloading connector and for its
  ``kv_cache_report_mode="full"`` prefix-cache hits. A store that failed or dropped any
  chunk announces nothing (a missed announcement costs a router one cache miss; a false one
  would send it requests kvtier cannot serve).
- Each worker reports the stores it committed (``get_kv_connector_kv_cache_events``); the
  scheduler publishes (``take_events``) only the events every worker reported in that step,
  i.e. a chunk counts as stored only when every tensor-parallel rank stored its shard.
- ``BlockRemoved`` (``medium="CPU"``, one per such group), with ``kvtierd_events`` set: the
  scheduler subscribes to kvtierd's own events and, at each step, relays the DRAM removals
  (evictions, ``kvtierctl evict``; all of them when kvtierd restarts) of chunks it announced,
  with their vLLM block hashes (_vllm_removals). ``AllBlocksCleared`` is never sent.
  ``reset_cache`` (vLLM's ``reset_prefix_cache(reset_connector=True)``) starts a new
  generation of this engine's namespaces, so nothing stored before is served to it again; it
  sends no ``AllBlocksCleared`` (the chunks stay, for other engines)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from vllm.distributed.kv_events import (
    MEDIUM_CPU,
    BlockStored,
    KVCacheEvent,
    KVConnectorKVEvents,
    KVEventAggregator,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)
from vllm.logger import init_logger
from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash, resolve_block_hashes

from kvtier.integrations._vllm_plan import _StoredBlocks

if TYPE_CHECKING:
    from vllm.v1.request import Request

logger = init_logger("vllm.kvtier_connector")

# Each counter, with what its Prometheus series says it counts.
_STAT_DOCS = {
    "loaded_tokens": "Prompt tokens whose KV the workers loaded from kvtier (not the engine's "
                     "own prefix-cache hit), summed over tensor-parallel ranks.",
    "load_error_blocks": "Engine blocks a kvtier load promised but did not deliver "
                         "(recomputed by vLLM).",
    "stored_tokens": "Prompt tokens whose KV the workers stored in kvtier.",
    "already_stored_tokens": "Prompt tokens a store found in kvtier already.",
    "dropped_chunks": "Chunks a store could not place (no space, NVMe behind, session limit).",
    "unsafe_chunks": "Chunks not stored because their KV was not known good in the engine "
                     "(a load below them failed in the same step, or a copy of the store).",
    "fail_open_calls": "Stores whose call to kvtierd failed open (dropped).",
    "stored_states": "Mamba states (one per request, chunk boundary and tensor-parallel rank) "
                     "stored in kvtier.",
    "dropped_states": "Mamba states a store did not place in kvtier.",
    "loaded_states": "Mamba states loaded from kvtier (one per loaded request and "
                     "tensor-parallel rank).",
    "load_error_states": "Mamba states a load promised but did not deliver (the request "
                         "is recomputed).",
}
_STAT_KEYS = tuple(_STAT_DOCS)


@dataclass
class KvtierConnectorStats(KVConnectorStats):
    """Worker-side counters of one logging interval, summed over workers."""

    def __post_init__(self) -> None:
        for key in _STAT_KEYS:
            self.data.setdefault(key, 0)

    def reset(self) -> None:
        self.data = {key: 0 for key in _STAT_KEYS}

    def aggregate(self, other: KVConnectorStats) -> "KvtierConnectorStats":
        for key in _STAT_KEYS:
            self.data[key] += int(other.data.get(key, 0))
        return self

    def reduce(self) -> dict[str, int | float]:
        return {f"kvtier_{key}": int(self.data[key]) for key in _STAT_KEYS}

    def is_empty(self) -> bool:
        return not any(self.data[key] for key in _STAT_KEYS)


class KvtierPromMetrics(KVConnectorPromMetrics):
    """KvtierConnectorStats as Prometheus counters on vLLM's own /metrics (``build_prom_metrics``):
    ``vllm:kvtier_<counter>_total``, with vLLM's per-engine labels."""

    def __init__(self, vllm_config: Any, metric_types: dict[type, type],
                 labelnames: list[str], per_engine_labelvalues: dict[int, list[object]]) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._counters: dict[str, dict[int, Any]] = {}
        for key, doc in _STAT_DOCS.items():
            counter = self._counter_cls(name=f"vllm:kvtier_{key}", documentation=doc,
                                        labelnames=labelnames)
            self._counters[key] = {engine: counter.labels(*values)
                                   for engine, values in per_engine_labelvalues.items()}

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for key, per_engine in self._counters.items():
            n = int(transfer_stats_data.get(key, 0))
            if n > 0:
                per_engine[engine_idx].inc(n)


class KvtierKVEvents(KVConnectorKVEvents):
    """The KV cache events of one step, as vLLM's KVEventAggregator counts them: one worker's
    (each event once), or after vLLM's executor merged the workers' (``add_events`` and
    ``increment_workers``), every worker's. ``aggregate`` keeps the events every worker sent.
    Not thread-safe."""

    def __init__(self, num_workers: int) -> None:
        self._aggregator = KVEventAggregator(num_workers)

    def add_events(self, events: list[KVCacheEvent]) -> None:
        self._aggregator.add_events(events)

    def aggregate(self) -> "KvtierKVEvents":
        common = self._aggregator.get_common_events()
        self._aggregator.clear_events()
        self._aggregator.add_events(common)
        self._aggregator.reset_workers()
        return self

    def increment_workers(self, count: int = 1) -> None:
        self._aggregator.increment_workers(count)

    def get_all_events(self) -> list[KVCacheEvent]:
        return self._aggregator.get_all_events()

    def get_number_of_workers(self) -> int:
        return self._aggregator.get_number_of_workers()

    def clear_events(self) -> None:
        self._aggregator.clear_events()
        self._aggregator.reset_workers()

    def __repr__(self) -> str:
        return (f"<KvtierKVEvents workers={self.get_number_of_workers()} "
                f"events={self.get_all_events()}>")


def stored_blocks(request: "Request", hash_block_size: int, block_size: int,
                  blocks_per_chunk: int, first_chunk: int, end_chunk: int
                  ) -> Optional[_StoredBlocks]:
    """vLLM's hashes of the blocks of chunks [first_chunk, end_chunk) of a request, for the
    worker's BlockStored; None when vLLM has not hashed those blocks.

    The workers announce a save, not the scheduler: only a worker knows whether its commit
    succeeded, and vLLM's executor merges the workers' events so that take_events can keep
    those every rank reported. The hashes are the scheduler's (the workers never see the
    Request), so they travel with the save: 8 bytes a block with vLLM's default int hashes."""
    hashes = resolve_block_hashes(request.block_hashes, hash_block_size, block_size)
    first, end = first_chunk * blocks_per_chunk, end_chunk * blocks_per_chunk
    if len(hashes) < end:
        logger.warning_once("kvtier: vLLM has not hashed the blocks of a stored prompt "
                            "(%d of %d); its KV cache events are not sent", len(hashes), end)
        return None
    lora = request.lora_request
    tokens = block_size * blocks_per_chunk
    return _StoredBlocks(
        block_hashes=[maybe_convert_block_hash(h) for h in hashes[first:end]],
        parent_block_hash=maybe_convert_block_hash(hashes[first - 1]) if first > 0 else None,
        token_ids=list(request.prompt_token_ids or [])[first_chunk * tokens:end_chunk * tokens],
        lora_id=lora.adapter_id if lora is not None else None,
        lora_name=lora.lora_name if lora is not None else None,
        session_id=request.session_id)


def block_stored(blocks: _StoredBlocks, num_tokens: int, block_size: int,
                 groups: list[tuple[int, str, Optional[int]]]) -> list[BlockStored]:
    """The BlockStored of a committed save of `num_tokens` tokens, one per KV cache group
    (`groups`: vLLM's index, spec kind and sliding window of each group holding KV). Identical
    on every worker, so vLLM's aggregator can count them."""
    return [BlockStored(block_hashes=list(blocks.block_hashes),
                        parent_block_hash=blocks.parent_block_hash,
                        token_ids=blocks.token_ids[:num_tokens], block_size=block_size,
                        lora_id=blocks.lora_id, medium=MEDIUM_CPU, lora_name=blocks.lora_name,
                        group_idx=g, kv_cache_spec_kind=kind,
                        kv_cache_spec_sliding_window=window, locality="LOCAL",
                        session_id=blocks.session_id)
            for g, kind, window in groups]
