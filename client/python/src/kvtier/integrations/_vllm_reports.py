"""What the vLLM connector's workers report to vLLM: their counters (KvtierConnectorStats,
summed over workers by vLLM) and the KV cache events of what kvtierd committed
(KvtierKVEvents). Re-exported by kvtier.integrations.vllm."""

from __future__ import annotations

from dataclasses import dataclass

from vllm.distributed.kv_events import KVCacheEvent, KVConnectorKVEvents, KVEventAggregator
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats

_STAT_KEYS = ("loaded_tokens", "load_error_blocks", "stored_tokens", "already_stored_tokens",
              "dropped_chunks", "unsafe_chunks", "fail_open_calls")


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
