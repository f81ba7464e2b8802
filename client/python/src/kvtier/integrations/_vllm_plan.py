"""What the vLLM connector is configured with (_Settings, from kv_connector_extra_config) and
what its scheduler tells its workers each step (KvtierConnectorMetadata: the loads and saves to
run), with the scheduler's state of each running request (_Tracker) and its prefetches
(_Prefetcher). Used by kvtier.integrations.vllm, which re-exports KvtierConnectorMetadata."""

from __future__ import annotations

import concurrent.futures
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata
from vllm.v1.core.kv_cache_utils import ExternalBlockHash

import kvtier


@dataclass
class _Settings:
    socket: str = ""
    deadline_ms: int = 100
    chunk_tokens: int = 256
    model_id: str = ""
    prefetch_deadline_ms: int = 2000
    prefetch_wait_ms: int = 20
    gpu_backend: str = "auto"
    weights_fingerprint: str = "auto"
    kvtierd_events: str = ""

    @classmethod
    def parse(cls, extra: dict[str, Any], default_model: str) -> "_Settings":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(extra) - known)
        if unknown:
            raise ValueError(f"kvtier: unknown kv_connector_extra_config keys {unknown}; "
                             f"known: {sorted(known)}")
        s = cls(**{k: v for k, v in extra.items() if k in known})
        for name in ("deadline_ms", "chunk_tokens", "prefetch_deadline_ms", "prefetch_wait_ms"):
            value = getattr(s, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"kvtier: {name} must be a positive integer, not {value!r}")
        if s.prefetch_deadline_ms > 600_000:  # kvtierd's bound on a Prefetch's deadline_ms
            raise ValueError(f"kvtier: prefetch_deadline_ms must be at most 600000 (10 min), "
                             f"not {s.prefetch_deadline_ms}")
        if s.prefetch_wait_ms > s.prefetch_deadline_ms:
            raise ValueError(f"kvtier: prefetch_wait_ms ({s.prefetch_wait_ms}) must not exceed "
                             f"prefetch_deadline_ms ({s.prefetch_deadline_ms}), after which the "
                             f"daemon lets the prefetch go")
        for name in ("socket", "model_id", "kvtierd_events"):
            if not isinstance(getattr(s, name), str):
                raise ValueError(f"kvtier: {name} must be a string, not {getattr(s, name)!r}")
        if s.gpu_backend not in ("auto", "cuda", "host"):
            raise ValueError(f"kvtier: gpu_backend must be auto, cuda or host, "
                             f"not {s.gpu_backend!r}")
        if not isinstance(s.weights_fingerprint, str) or not s.weights_fingerprint:
            raise ValueError(f"kvtier: weights_fingerprint must be auto, off or a non-empty "
                             f"string, not {s.weights_fingerprint!r}")
        s.model_id = s.model_id or default_model
        return s


@dataclass
class _LoadSpec:
    req_id: str
    token_ids: list[int]
    block_ids: list[list[int]]  # one table per KV cache group
    engine_tokens: int    # the engine's own prefix-cache hit (already in its blocks)
    promised_tokens: int  # engine_tokens + what get_num_new_matched_tokens promised
    cache_salt: Optional[str]
    lora_key: Optional[str]  # the namespace's LoRA field (see _lora_key)
    # The scheduler's prefetch ticket (id, session_id) in tensor-parallel rank 0's namespace:
    # that rank's worker takes it over, so its chunks count as prefetched and are let go at once.
    ticket: Optional[tuple[int, int]] = None
    generation: str = ""  # the scheduler's cache generation (see reset_cache)
    # Loaded whole before the step's forward pass and reported through
    # get_transfer_results (the request waits in WAITING_FOR_REMOTE_KVS meanwhile), rather than
    # layer by layer within it.
    asynchronous: bool = False
    # The scheduler's prefetch ticket (id, session_id) of a Mamba model's state (_vllm_mamba).
    state_ticket: Optional[tuple[int, int]] = None


@dataclass
class _StoredBlocks:
    """What a worker needs, beyond its _SaveSpec, to announce the save as a BlockStored: vLLM's
    hashes of the blocks the saved chunks cover. Only sent when KV cache events are enabled."""

    block_hashes: list[ExternalBlockHash]  # chunk_tokens / block_size per saved chunk
    parent_block_hash: Optional[ExternalBlockHash]  # of the block before; None at token 0
    token_ids: list[int]  # the prompt's own ids of the saved chunks (not kvtier's key ids)
    lora_id: Optional[int]
    lora_name: Optional[str]
    session_id: Optional[str]


@dataclass
class _SaveSpec:
    req_id: str
    token_ids: list[int]  # the prompt through the last full chunk this step computed
    block_ids: list[list[int]]  # one table per KV cache group
    first_chunk: int      # chunks before it were saved by earlier steps
    cache_salt: Optional[str]
    lora_key: Optional[str]
    stored_blocks: Optional[_StoredBlocks] = None  # None: KV cache events off
    generation: str = ""  # the scheduler's cache generation (see reset_cache)


@dataclass
class _StateSave:
    """A Mamba state to store after the step's forward pass (see _vllm_mamba)."""

    req_id: str
    token_ids: list[int]  # the prompt through the boundary the state follows
    blocks: list[int]  # the block holding it, one per Mamba group
    cache_salt: Optional[str]
    lora_key: Optional[str]
    generation: str


@dataclass
class KvtierConnectorMetadata(KVConnectorMetadata):
    """What the scheduler tells the workers each step: the loads and saves to run."""

    loads: list[_LoadSpec] = field(default_factory=list)
    saves: list[_SaveSpec] = field(default_factory=list)
    state_saves: list[_StateSave] = field(default_factory=list)


@dataclass
class _Tracker:
    """Scheduler-side state of one running request."""

    token_ids: list[int]  # kvtier's key ids of the prompt (see _names.key_tokens)
    block_ids: list[list[int]]  # one table per KV cache group
    saved_chunks: int
    cache_salt: Optional[str]
    lora_key: Optional[str]
    generation: str


class _Prefetcher:
    """The scheduler's prefetches, each on a thread of its own (kvtier.Client is thread-safe
    and drops the GIL while it waits), so that a daemon slow to answer (its remote tier slow to
    say what it holds) holds up vLLM's scheduler step for `wait_ms` at most."""

    def __init__(self, client: kvtier.Client, deadline_ms: int, wait_ms: int) -> None:
        self._client = client
        self._deadline_ms = deadline_ms
        self._wait_s = wait_ms / 1000
        self._pending: dict[str, concurrent.futures.Future[kvtier.PrefetchTicket]] = {}
        self._threads: Optional[concurrent.futures.ThreadPoolExecutor] = None

    def ask(self, rid: str, ns: kvtier.Namespace, tokens: list[int],
            request_tag: str) -> Optional[kvtier.PrefetchTicket]:
        """The ticket of request `rid`'s prefetch (started on its first call); None while the
        daemon has not answered. Raises what Client.prefetch raises."""
        pending = self._pending.get(rid)
        if pending is None:
            if self._threads is None:
                self._threads = concurrent.futures.ThreadPoolExecutor(
                    max_workers=4, thread_name_prefix="kvtier-prefetch")
            pending = self._threads.submit(self._client.prefetch, ns, tokens,
                                           deadline_ms=self._deadline_ms,
                                           request_id=request_tag)
            self._pending[rid] = pending
        try:
            ticket = pending.result(timeout=self._wait_s)
        except concurrent.futures.TimeoutError:
            return None
        del self._pending[rid]
        return ticket

    def forget(self, rid: str) -> None:
        """A request that finished before its prefetch answered: its ticket, if it comes, lapses
        at its deadline in the daemon."""
        self._pending.pop(rid, None)

    def shutdown(self) -> None:
        if self._threads is not None:
            self._threads.shutdown(wait=True, cancel_futures=True)
