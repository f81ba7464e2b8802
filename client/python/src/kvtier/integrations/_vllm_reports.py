"""What the vLLM connector's workers report to vLLM: their counters (KvtierConnectorStats,
summed over workers by vLLM, and shown on vLLM's own /metrics by KvtierPromMetrics) and the
KV cache events of what kvtierd committed (KvtierKVEvents). Re-exported by
kvtier.integrations.vllm."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_events import KVCacheEvent, KVConnectorKVEvents, KVEventAggregator
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)

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
