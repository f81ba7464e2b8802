"""kvtier as a vLLM KV connector (``KVConnectorBase_V1``, vLLM 0.33).

Enable it with::

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "KvtierConnector",
        "kv_connector_module_path": "kvtier.integrations.vllm", "kv_role": "kv_both",
        "kv_connector_extra_config": {"socket": "/run/user/1000/kvtier/kvtierd.sock"}}'

``kv_role``: ``kv_both`` loads and stores; ``kv_consumer`` (the decode instance of prefill/decode
disaggregation) loads and stores nothing of its own; ``kv_producer`` stores, and loads too
(what it finds cached it need not prefill again).

``kv_connector_extra_config`` keys (all optional):

- ``socket``: kvtierd's socket; ``{tp_rank}`` in it is replaced by the worker's tensor-parallel
  rank (one kvtierd per GPU). Default: ``${XDG_RUNTIME_DIR:-/tmp}/kvtier/kvtierd.sock``.
- ``deadline_ms``: deadline of each call to the daemon; past it the cache fails open (a
  miss, recomputed). Default: 100.
- ``chunk_tokens``: tokens per kvtier chunk; a multiple of vLLM's block size. Default: 256.
- ``model_id``: the model name in the namespace; engines share KV only when it matches.
  Default: ``--model`` as given to vLLM.
- ``weights_fingerprint``: ``"auto"`` appends a fingerprint of the model's weights and config
  files (``kvtier.integrations._weights``: names, sizes, config and safetensors headers, and
  sampled bytes of every weight file) to the model id, so that two engines serving different
  weights under one name never share KV, while byte-identical copies anywhere do. ``"off"``
  keys on ``model_id`` alone (the operator vouches that every engine using it serves the same
  weights); any other string is used as the fingerprint as it is (a release tag, say). When
  ``"auto"`` finds no weight file (a model vLLM did not load from a local folder or the Hugging
  Face cache), the engine refuses to start with kvtier, naming the model. Default: ``"auto"``.
- ``prefetch_deadline_ms``: how long the daemon holds a queued request's prefetched prefix
  in DRAM; at most 600000 (kvtierd's bound). Default: 2000.
- ``prefetch_wait_ms``: how long vLLM's scheduler waits for a new request's prefetch to
  answer; past it the request waits for a later step (the connector answers "ask me again"),
  so a slow remote tier never holds up the scheduler's step longer. At most
  ``prefetch_deadline_ms``. Default: 20.
- ``gpu_backend``: ``"cuda"``, ``"host"`` (emulation: CPU tensors) or ``"auto"`` (by the
  device of the KV cache tensors). Default: ``"auto"``.
- ``kvtierd_events``: kvtierd's ``--events-address`` (ZMQ), from which the scheduler relays
  evictions as ``BlockRemoved`` when vLLM's KV cache events are on. Default: none.

What runs where (the scheduler and each worker have their own ``kvtier.Client``):

- scheduler, ``get_num_new_matched_tokens``: on a request's first call a prefetch (the
  daemon promotes its NVMe chunks into DRAM while the request waits), on a thread of its own:
  when the daemon has not answered within ``prefetch_wait_ms`` (its remote tier is slow to
  say what it holds), the answer is None, and vLLM asks again at its next step; the hit is the
  cached prefix in whole chunks (what a load delivers), short of the prompt's last token. With
  one KV cache group, loads are synchronous within the forward pass (``False``): they run layer
  by layer. With several (vLLM's hybrid allocator, which the connector supports:
  ``SupportsHMA``), a load is asynchronous (``True``): vLLM fails only whole requests of such
  models (``failed_recving``), so the worker copies the whole prefix in ``start_load_kv`` and
  reports it in ``get_transfer_results`` (docs/HYBRID.md).
- worker, ``start_load_kv``: a ``LayerwiseLoader`` per request leases the whole prefix and
  queues the first layers' copies on a load stream; ``wait_for_layer_load`` queues the
  copies of a layer more and makes the compute stream wait for that layer (no host sync on
  CUDA).
- worker, ``save_kv_layer``: a ``LayerwiseStorer`` per request copies each layer out as
  attention writes it; only the prompt's full chunks whose KV this step computed (chunked
  prefill stores a prompt over several steps); ``wait_for_save`` commits. A save never
  outlives its step, so when vLLM preempts a request and hands its blocks to another, no copy
  out of them is in flight: ``handle_preemptions`` has nothing to do (vLLM's offloading
  connector needs it because its saves run across steps).
- ``get_block_ids_with_load_errors``: blocks whose copy failed, whose lease lapsed, or that
  the daemon no longer had when the worker loaded (the prefix shrank after the scheduler
  counted it). vLLM recomputes them.

KV cache events (``BlockStored`` of committed stores, ``BlockRemoved`` relayed from kvtierd's
own events with ``kvtierd_events``): see kvtier.integrations._vllm_reports.

Mamba and linear-attention state (vLLM's "align" mode): see kvtier.integrations._vllm_mamba.

KV layouts: vLLM's standardized per-layer view ``[num_blocks, num_kv_heads, block_size,
2 * head_size]`` of every MHA backend (flash-attn, flashinfer, triton, CPU), in any
physical order (NHD, HND, cross-layer), read from the tensors' strides; MLA
``[num_blocks, 1, block_size, latent_dim]`` (or 3-D). Older 5-D flash-attn and flashinfer
tensors are recognised too.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Optional

import torch
from vllm.distributed.kv_events import (
    BlockStored,
    KVCacheEvent,
    KVConnectorKVEvents,
)
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
    SupportsHMA,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats
from vllm.logger import init_logger
from vllm.v1.kv_cache_interface import (
    get_kv_cache_spec_kind,
    get_kv_cache_spec_sliding_window,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource
from vllm.v1.outputs import KVConnectorOutput

import kvtier
from kvtier.integrations._names import key_tokens, namespace_text
from kvtier.integrations._vllm_groups import (
    group_layer_names,
    kv_groups,
    live_chunks,
    load_tables,
    namespace_spec,
    paged_cache,
    sliding_windows,
)
from kvtier.integrations._vllm_mamba import MambaStates
from kvtier.integrations._weights import weights_fingerprint
from kvtier.integrations._vllm_plan import (
    KvtierConnectorMetadata,
    _LoadSpec,
    _Prefetcher,
    _SaveSpec,
    _Settings,
    _StoredBlocks,
    _Tracker,
)
from kvtier.integrations._vllm_removals import removal_relay
from kvtier.integrations._vllm_reports import (
    KvtierConnectorStats,
    KvtierKVEvents,
    KvtierPromMetrics,
    block_stored,
    stored_blocks,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

# Under vLLM's logger, so these lines reach vLLM's log handler and level.
logger = init_logger("vllm.kvtier_connector")

__all__ = ["KvtierConnector", "KvtierConnectorMetadata", "KvtierConnectorStats",
           "KvtierKVEvents", "KvtierPromMetrics"]


def _request_tag(request_id: str) -> str:
    """The request id kvtierd counts the token hit rate under (at most 256 bytes):
    vLLM's own id, or its SHA-256 when a client-supplied id is longer."""
    raw = request_id.encode()
    return request_id if len(raw) <= 256 else hashlib.sha256(raw).hexdigest()


def _state_tag(request_id: str) -> str:
    """The request id of a request's Mamba state prefetch and load (a request of its own)."""
    return _request_tag(f"{request_id}#mamba-state")


class KvtierConnector(KVConnectorBase_V1, SupportsHMA):
    """Loads and stores vLLM's KV cache through kvtierd (see the module docstring)."""

    _cache_hit_source = CacheHitSource.HOST

    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole,
                 kv_cache_config: "KVCacheConfig") -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        model = vllm_config.model_config.model if vllm_config.model_config else ""
        self._settings = _Settings.parse(dict(extra), model)
        self._block_size = vllm_config.cache_config.block_size
        self._chunk = self._settings.chunk_tokens
        self._stores = self._kv_transfer_config.is_kv_producer  # not a kv_consumer
        if vllm_config.parallel_config.pipeline_parallel_size > 1:
            raise ValueError("kvtier: pipeline parallelism is not supported yet (the stages' "
                             "layers would share one namespace)")
        tp_rank = 0
        if role == KVConnectorRole.WORKER and vllm_config.parallel_config.tensor_parallel_size > 1:
            from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
            tp_rank = get_tensor_model_parallel_rank()
        self._tp_rank = tp_rank
        self._spec = namespace_spec(vllm_config, kv_cache_config, self._settings, tp_rank)
        self._group_names = group_layer_names(kv_cache_config)
        # The KV groups (all but Mamba state: _vllm_mamba), each's sliding window (0: full
        # attention; blocks before it are the null block 0). With several groups a load is
        # asynchronous: vLLM fails only whole requests of them (failed_recving).
        self._kv_groups = kv_groups(kv_cache_config)
        self._windows = sliding_windows(kv_cache_config)
        self._mamba = MambaStates(kv_cache_config, self._group_names, tp_rank,
                                  vllm_config.parallel_config.tensor_parallel_size)
        self._num_groups = len(kv_cache_config.kv_cache_groups)
        self._async_loads = self._num_groups > 1
        self._client = kvtier.Client.connect(
            socket=self._settings.socket.replace("{tp_rank}", str(tp_rank)),
            deadline_ms=self._settings.deadline_ms,
            client_name=f"vllm-{role.name.lower()}-tp{tp_rank}")
        self._namespaces: dict[tuple[str, str, str, bool], Optional[kvtier.Namespace]] = {}
        # "" until reset_cache; then a fresh random tag in every namespace's model id: what
        # was cached before (under weights since updated in place, say) is never served again.
        self._generation = ""
        events = vllm_config.kv_events_config
        self._events_enabled = bool(events is not None and events.enable_kv_cache_events)
        # Scheduler side.
        self._tickets: dict[str, kvtier.PrefetchTicket] = {}
        # Per request of a Mamba model: MambaStates.hit's (chunk end, state ticket).
        self._state_hits: dict[str, tuple[int, Optional[tuple[int, int]]]] = {}
        self._prefetcher = _Prefetcher(self._client, self._settings.prefetch_deadline_ms,
                                       self._settings.prefetch_wait_ms)
        self._engine_tokens: dict[str, int] = {}
        self._pending_loads: dict[str, tuple[int, int]] = {}
        self._async_loads_due: list[_LoadSpec] = []  # for the next build_connector_meta
        self._failed_loads: set[str] = set()  # requests whose asynchronous load failed
        self._request_keys: dict[str, tuple[Optional[str], Optional[str], str]] = {}
        self._request_tokens: dict[str, list[int]] = {}  # kvtier's key ids (_names.key_tokens)
        self._lora_keys: dict[tuple[str, str], str] = {}  # (name, path) -> _lora_key
        self._trackers: dict[str, _Tracker] = {}
        # KV cache events (empty unless enabled): the requests, for their block hashes, at the
        # granularity vLLM hashes them; the events every worker reported, until take_events.
        self._event_requests: dict[str, "Request"] = {}
        self._hash_block_size = kv_cache_config.hash_block_size or self._block_size
        self._event_specs = [(i, get_kv_cache_spec_kind(g.kv_cache_spec).value,
                              get_kv_cache_spec_sliding_window(g.kv_cache_spec))
                             for i, g in enumerate(kv_cache_config.kv_cache_groups)
                             if i in self._kv_groups]
        self._published: list[KVCacheEvent] = []
        self._relay = (removal_relay(self._settings.kvtierd_events, self._kv_groups,
                                     self._events_enabled)
                       if role == KVConnectorRole.SCHEDULER else None)
        # Worker side.
        self._runtime: Optional[kvtier.Runtime] = None
        self._arena: Optional[kvtier.GpuArena] = None
        self._cache: Optional[kvtier.PagedKvCache] = None
        self._layer_index: dict[str, int] = {}
        self._load_stream: Optional[kvtier.Stream] = None
        self._store_stream: Optional[kvtier.Stream] = None
        self._host_compute_stream: Optional[kvtier.Stream] = None
        self._wrapped_streams: dict[int, kvtier.Stream] = {}
        self._loaders: list[tuple[_LoadSpec, kvtier.LayerwiseLoader]] = []
        self._recved: KVConnectorTransferResults = KVConnectorTransferResults()
        # Per request of this step: the first token whose KV is not known good in the engine's
        # blocks (a load that delivered less than promised, or a copy that failed). Nothing
        # from there on is stored, neither the blocks whose load failed nor what this step
        # computed on top of them (vLLM recomputes both in a later step, and stores them then).
        self._bad_from: dict[str, int] = {}
        self._storers: Optional[list[tuple[_SaveSpec, kvtier.LayerwiseStorer]]] = None
        self._load_errors: set[int] = set()
        self._stats = KvtierConnectorStats()
        # The BlockStored of this worker's committed saves since the last report; None when
        # there is nothing to report (events off, or no save was due).
        self._stored_events: Optional[list[BlockStored]] = None
        logger.info("kvtier connector (%s) on %s: %s", role.name.lower(),
                    self._settings.socket or "the default socket", self._spec)

    # ---------------------------------------------------------------- shared

    def _namespace(self, cache_salt: Optional[str], lora_key: Optional[str],
                   generation: str = "", state: bool = False) -> Optional[kvtier.Namespace]:
        """The namespace of a salt, a LoRA adapter and a cache generation (reset_cache), or
        with `state` the Mamba state namespace beside it; None when the daemon refuses it (e.g.
        it holds too many namespaces): those requests run without the cache."""
        key = (namespace_text(cache_salt), namespace_text(lora_key), generation, state)
        if key in self._namespaces:
            return self._namespaces[key]
        spec = dict(self._spec)
        if generation:
            spec["model_id"] = namespace_text(f"{spec['model_id']}#reset:{generation}")
        if state:
            spec = self._mamba.namespace_spec(spec)
        ns: Optional[kvtier.Namespace] = None
        try:
            ns = self._client.open_namespace(**spec, cache_salt=key[0], lora_id=key[1])
        except kvtier.Error as e:
            logger.warning("kvtier: namespace (salt %r, lora %r) refused, its requests run "
                           "without the cache: %s", key[0], key[1], e)
        self._namespaces[key] = ns
        return ns

    def _lora_key(self, request: "Request") -> Optional[str]:
        """The namespace's LoRA field of a request: the adapter's name and the fingerprint of
        its weights (its path when they cannot be read), so that a name re-pointed at other
        weights never reuses the KV of the old ones (vLLM's own block hashes take the path)."""
        lora = getattr(request, "lora_request", None)
        if lora is None:
            return None
        name, path = str(lora.lora_name), str(getattr(lora, "lora_path", "") or "")
        key = self._lora_keys.get((name, path))
        if key is None:
            fingerprint = weights_fingerprint(path) if path else None
            key = f"{name}@weights:{fingerprint}" if fingerprint else f"{name}@path:{path}"
            self._lora_keys[(name, path)] = key
        return key

    def _key_tokens(self, prompt_token_ids: Optional[list[int]],
                    mm_features: Optional[list[Any]]) -> list[int]:
        """The ids kvtier keys a prompt's chunks on (see _names.key_tokens)."""
        return key_tokens(prompt_token_ids, mm_features, self._chunk)

    def shutdown(self) -> None:
        self._prefetcher.shutdown()
        if self._relay is not None:
            self._relay.close()
        self._client.close()

    # ------------------------------------------------------------- scheduler

    def get_num_new_matched_tokens(self, request: "Request",
                                   num_computed_tokens: int) -> tuple[int | None, bool]:
        rid = request.request_id
        if getattr(request, "prompt_embeds", None) is not None:
            return 0, False  # no ids to key on: such requests run without kvtier
        tokens = self._key_tokens(request.prompt_token_ids, request.mm_features)
        self._request_tokens[rid] = tokens
        self._request_keys[rid] = (request.cache_salt, self._lora_key(request), self._generation)
        if self._events_enabled:
            self._event_requests[rid] = request
        ns = self._namespace(*self._request_keys[rid])
        if ns is None or rid in self._failed_loads:  # a failed load is not tried again
            return 0, False
        if rid not in self._tickets:
            ticket = self._prefetcher.ask(rid, ns, tokens, _request_tag(rid))
            if ticket is None:
                return None, False  # vLLM asks again at its next step
            if ticket.fail_open is not None:
                logger.debug("kvtier prefetch failed open: %s", ticket.fail_open)
            self._tickets[rid] = ticket
            cached = ticket.total_chunks * self._chunk
        else:
            cached = self._client.lookup(ns, tokens, request_id=_request_tag(rid)).cached_tokens
        # At least one prompt token is computed, and a load delivers whole chunks only.
        limit = (max(len(tokens) - 1, 0) // self._block_size) * self._block_size
        end = min(cached, limit) // self._chunk
        if self._mamba and end * self._chunk > num_computed_tokens:
            # Only up to the last chunk whose Mamba state kvtierd holds (found once).
            found = self._state_hits.get(rid)
            state_ns = self._namespace(*self._request_keys[rid], state=True)
            if (found is None or found[0] > end) and state_ns is not None:
                found = self._mamba.hit(self._client, ns, state_ns, tokens,
                                        num_computed_tokens // self._chunk, end,
                                        self._settings.prefetch_deadline_ms, _state_tag(rid))
                self._state_hits[rid] = found
            end = found[0] if found is not None and found[0] <= end else 0
        external = max(0, end * self._chunk - num_computed_tokens)
        self._engine_tokens[rid] = num_computed_tokens
        return external, self._async_loads and external > 0

    def get_external_cache_hit_sources(self, request: "Request",
                                       num_external_tokens: int) -> dict[CacheHitSource, int]:
        if num_external_tokens == 0:
            return {}
        ticket = self._tickets.get(request.request_id)
        if ticket is None:
            return {CacheHitSource.HOST: num_external_tokens}
        # The prefix's DRAM chunks come first, then its NVMe chunks, then the
        # remote tier's (vLLM counts a remote store as EXTERNAL_UNSPECIFIED).
        disk_end = (ticket.total_chunks - ticket.remote_chunks) * self._chunk
        dram_end = disk_end - ticket.nvme_chunks * self._chunk
        start = self._engine_tokens.get(request.request_id, 0)
        end = start + num_external_tokens
        remote = max(0, end - max(disk_end, start))
        disk = max(0, min(end, disk_end) - max(dram_end, start))
        sources = {CacheHitSource.HOST: num_external_tokens - disk - remote,
                   CacheHitSource.DISK: disk, CacheHitSource.EXTERNAL_UNSPECIFIED: remote}
        return {k: v for k, v in sources.items() if v > 0}

    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks",
                                 num_external_tokens: int) -> None:
        rid = request.request_id
        if num_external_tokens == 0 or rid not in self._request_keys:
            return  # also the second call after an asynchronous load
        engine = self._engine_tokens.get(rid, 0)
        if not self._async_loads:
            self._pending_loads[rid] = (engine, engine + num_external_tokens)
            return
        # An asynchronous load: the request is not scheduled until it is done, so its blocks
        # are taken here, one table per group.
        tracker = _Tracker(self._request_tokens[rid],
                           [list(b) for b in blocks.get_block_ids()], 0,
                           *self._request_keys[rid])
        self._pending_loads[rid] = (engine, engine + num_external_tokens)
        self._add_load(self._async_loads_due, rid, tracker, asynchronous=True)

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        meta = KvtierConnectorMetadata(loads=self._async_loads_due)
        self._async_loads_due = []
        scheduled = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            rid = new.req_id
            if rid not in self._request_keys:
                continue  # not looked up: prompt embeddings, or a request kvtier never saw
            salt, lora, generation = self._request_keys[rid]
            tokens = self._request_tokens.get(rid)
            if tokens is None:
                tokens = self._key_tokens(new.prompt_token_ids, new.mm_features)
            # With a sliding window, the blocks of what the engine held before this step (its
            # prefix cache, an asynchronous load) may be gone: only what it computes is saved.
            first = new.num_computed_tokens // self._chunk if any(self._windows) else 0
            tracker = _Tracker(tokens, [list(b) for b in new.block_ids], first, salt, lora,
                               generation)
            self._trackers[rid] = tracker
            self._add_load(meta.loads, rid, tracker)
            self._add_save(meta, rid, tracker, new.num_computed_tokens + scheduled.get(rid, 0))
        cached = scheduler_output.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            tracker = self._trackers.get(rid)
            if tracker is None:
                continue
            new_blocks = cached.new_block_ids[i]
            if rid in cached.resumed_req_ids:
                tracker.block_ids = ([list(b) for b in new_blocks] if new_blocks
                                     else [[] for _ in range(self._num_groups)])
            elif new_blocks:
                for table, added in zip(tracker.block_ids, new_blocks):
                    table.extend(added)
            # vLLM moves num_computed_tokens back when it recomputes (a load failed, or the
            # request was preempted): a chunk counts as saved only while the engine still
            # holds what was computed of it, so the recomputed chunks are saved again.
            tracker.saved_chunks = min(tracker.saved_chunks,
                                       cached.num_computed_tokens[i] // self._chunk)
            self._add_load(meta.loads, rid, tracker)
            self._add_save(meta, rid, tracker, cached.num_computed_tokens[i] + scheduled.get(rid, 0))
        if self._mamba and self._stores and scheduler_output.kv_connector_block_state:
            meta.state_saves = self._mamba.saves(
                scheduler_output.kv_connector_block_state.boundary_state_offloads,
                self._trackers, self._chunk)
        for rid in scheduler_output.finished_req_ids:
            self._forget(rid)
        self._pending_loads.clear()
        return meta

    def _kv_tables(self, block_ids: list[list[int]]) -> list[list[int]]:
        """The block tables of the KV groups (all but Mamba state), in payload order."""
        return [block_ids[g] for g in self._kv_groups]

    def _add_load(self, loads: list[_LoadSpec], rid: str, tracker: _Tracker,
                  asynchronous: bool = False) -> None:
        plan = self._pending_loads.pop(rid, None)
        if plan is not None:
            ticket = self._tickets.get(rid)
            loads.append(_LoadSpec(rid, tracker.token_ids, [list(b) for b in tracker.block_ids],
                                   plan[0], plan[1], tracker.cache_salt, tracker.lora_key,
                                   (ticket.id, ticket.session_id)
                                   if ticket is not None and ticket.id != 0 else None,
                                   tracker.generation, asynchronous,
                                   self._state_hits.get(rid, (0, None))[1]))

    def _add_save(self, meta: KvtierConnectorMetadata, rid: str, tracker: _Tracker,
                  computed_tokens: int) -> None:
        if not self._stores:
            return  # a kv_consumer stores nothing of its own
        full_chunks = min(computed_tokens, len(tracker.token_ids)) // self._chunk
        if full_chunks > tracker.saved_chunks:
            meta.saves.append(_SaveSpec(rid, tracker.token_ids[:full_chunks * self._chunk],
                                        [list(b) for b in tracker.block_ids],
                                        tracker.saved_chunks,
                                        tracker.cache_salt, tracker.lora_key,
                                        self._stored_blocks(rid, tracker.saved_chunks,
                                                            full_chunks),
                                        tracker.generation))
            tracker.saved_chunks = full_chunks

    def _stored_blocks(self, rid: str, first_chunk: int, end_chunk: int) -> Optional[_StoredBlocks]:
        """vLLM's hashes of the blocks of chunks [first_chunk, end_chunk) of a request, for the
        worker's BlockStored (see _vllm_reports.stored_blocks), remembered by the relay of
        removals; None when events are off or vLLM has not hashed those blocks."""
        request = self._event_requests.get(rid)
        blocks = None if request is None else stored_blocks(
            request, self._hash_block_size, self._block_size,
            self._chunk // self._block_size, first_chunk, end_chunk)
        tracker, keys = self._trackers.get(rid), self._request_keys.get(rid)
        ns = self._namespace(*keys) if keys is not None else None
        if self._relay is not None and blocks and tracker is not None and ns is not None:
            self._relay.remember(kvtier.Client.chunk_keys(
                ns, tracker.token_ids[:end_chunk * self._chunk])[first_chunk:],
                blocks.block_hashes)
        return blocks

    def _forget(self, rid: str) -> None:
        self._tickets.pop(rid, None)
        self._state_hits.pop(rid, None)
        self._failed_loads.discard(rid)
        self._prefetcher.forget(rid)
        self._engine_tokens.pop(rid, None)
        self._pending_loads.pop(rid, None)
        self._request_keys.pop(rid, None)
        self._request_tokens.pop(rid, None)
        self._trackers.pop(rid, None)
        self._event_requests.pop(rid, None)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        """Keeps the step's KV cache events that every worker reported (vLLM's executor merged
        one KvtierKVEvents per worker into connector_output.kv_cache_events). Counted per
        output, not across outputs: two ranks' reports of different steps are not a quorum.
        Remembers the requests whose asynchronous load failed, so they are not loaded again."""
        self._failed_loads |= connector_output.failed_recving
        events = connector_output.kv_cache_events
        if not self._events_enabled or not isinstance(events, KvtierKVEvents):
            return
        self._published.extend(events.aggregate().get_all_events())

    def take_events(self) -> Iterable[KVCacheEvent]:
        """The KV cache events kept since the last call (BlockStored, in the order the first
        worker reported them), then kvtierd's removals since (BlockRemoved), and forgets them."""
        events, self._published = self._published, []
        return events + (self._relay.poll() if self._relay is not None else [])

    def request_finished(self, request: "Request",
                         block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self._forget(request.request_id)
        return False, None  # saves complete within their step: the blocks can be freed

    def request_finished_all_groups(self, request: "Request", block_ids: tuple[list[int], ...]
                                    ) -> tuple[bool, dict[str, Any] | None]:
        return self.request_finished(request, [])

    # ---------------------------------------------------------------- worker

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        names = [n for group in self._group_names for n in group]  # the payload's order
        if sorted(names) != sorted(kv_caches):
            raise ValueError(f"kvtier: {len(kv_caches)} KV cache tensors registered, not the "
                             f"{len(names)} layers of the KV cache config")
        names = [n for g in self._kv_groups for n in self._group_names[g]]
        tensors = [kv_caches[n] for n in names]
        self._mamba.register(kv_caches)
        mla = self._spec["layout"] == "mla"
        head = self._spec["latent_dim"] if mla else self._spec["head_dim"]
        backend = self._settings.gpu_backend
        if backend == "auto":
            backend = "cuda" if tensors[0].is_cuda else "host"
        self._runtime = (kvtier.Runtime.cuda(tensors[0].device.index or 0)
                         if backend == "cuda" else kvtier.Runtime.host())
        self._arena = kvtier.GpuArena(self._runtime)
        self._cache = paged_cache(tensors, head, mla,
                                  [len(self._group_names[g]) for g in self._kv_groups])
        self._layer_index = {n: i for i, n in enumerate(names)}
        self._load_stream = self._runtime.create_stream()
        self._store_stream = self._runtime.create_stream()
        if backend == "host":
            self._host_compute_stream = self._runtime.create_stream()
        logger.info("kvtier: %d layers of %s registered on %s", len(names),
                    tuple(tensors[0].shape), self._runtime.name)

    def _compute_stream(self) -> kvtier.Stream:
        if self._host_compute_stream is not None:
            return self._host_compute_stream
        assert self._runtime is not None
        handle = torch.cuda.current_stream().cuda_stream
        stream = self._wrapped_streams.get(handle)
        if stream is None:
            stream = self._runtime.wrap_stream(handle)
            self._wrapped_streams[handle] = stream
        return stream

    def _block_range(self, block_ids: list[int], first_token: int, end_token: int) -> set[int]:
        first = first_token // self._block_size
        end = math.ceil(end_token / self._block_size)
        return set(block_ids[first:end])

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvtierConnectorMetadata)
        for spec in meta.loads:
            assert self._arena is not None and self._cache is not None
            assert self._runtime is not None and self._load_stream is not None
            ns = self._namespace(spec.cache_salt, spec.lora_key, spec.generation)
            blocks = load_tables(self._kv_tables(spec.block_ids),
                                 spec.engine_tokens // self._block_size, self._windows)
            loader = (kvtier.LayerwiseLoader(self._client, ns, self._arena, self._cache,
                                             self._runtime) if ns is not None else None)
            try:
                # Only rank 0 shares the scheduler's namespace (and, with a per-rank
                # socket, its daemon): the other ranks' chunks were never prefetched.
                ticket = (kvtier.PrefetchTicket(*spec.ticket)
                          if spec.ticket is not None and self._tp_rank == 0 else None)
                delivered = 0 if loader is None else loader.start_load(
                    spec.token_ids, blocks, self._load_stream, ticket=ticket,
                    first_chunk=spec.engine_tokens // self._chunk,
                    request_id=_request_tag(spec.req_id))
            except kvtier.Error as e:
                logger.warning("kvtier: load of request %s failed (%s); recomputing it",
                               spec.req_id, e)
                delivered = 0
            else:
                if loader is not None and spec.asynchronous:
                    # Every layer copied now; any copy failed or (for a Mamba model) the state
                    # missing: nothing delivered (vLLM recomputes the request from its start).
                    if loader.finish() or (self._mamba and delivered >= spec.promised_tokens
                                           and not self._load_state(spec)):
                        delivered = 0
                elif loader is not None:
                    self._loaders.append((spec, loader))
            if spec.asynchronous:
                self._recved.finished_recving.add(spec.req_id)
                if delivered < spec.promised_tokens:
                    self._recved.failed_recving.add(spec.req_id)
                    self._stats.data["load_error_blocks"] += math.ceil(
                        (spec.promised_tokens - spec.engine_tokens) / self._block_size)
            elif delivered < spec.promised_tokens:
                # The prefix shrank since the scheduler counted it: recompute the rest.
                good = max(delivered, spec.engine_tokens)
                lost = self._block_range(spec.block_ids[0], good, spec.promised_tokens) - (
                    {0} if self._windows[0] else set())  # a window's null block is no one's
                self._load_errors |= lost
                self._stats.data["load_error_blocks"] += len(lost)
                self._mark_bad(spec.req_id, good)
            self._stats.data["loaded_tokens"] += max(
                0, min(delivered, spec.promised_tokens) - spec.engine_tokens)

    def _state_namespaces(self, salt: Optional[str], lora_key: Optional[str],
                          generation: str) -> Optional[tuple[kvtier.Namespace, kvtier.Namespace]]:
        """The KV namespace and the Mamba state namespace beside it; None if either is refused."""
        ns = self._namespace(salt, lora_key, generation)
        state_ns = self._namespace(salt, lora_key, generation, state=True)
        return None if ns is None or state_ns is None else (ns, state_ns)

    def _load_state(self, spec: _LoadSpec) -> bool:
        """Writes the Mamba state after the loaded prefix into the request's blocks there."""
        loaded = self._mamba.load(
            self._client, self._state_namespaces(spec.cache_salt, spec.lora_key, spec.generation),
            spec.token_ids[:spec.promised_tokens], spec.block_ids, self._block_size,
            kvtier.PrefetchTicket(*spec.state_ticket)
            if spec.state_ticket is not None and self._tp_rank == 0 else None,
            _state_tag(spec.req_id))
        self._stats.data["loaded_states" if loaded else "load_error_states"] += 1
        return loaded

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        """The asynchronous loads done since the last call (each ran whole in its step's
        start_load_kv), failed ones among them as failed_recving too."""
        results, self._recved = self._recved, KVConnectorTransferResults()
        return results

    def wait_for_layer_load(self, layer_name: str) -> None:
        if not self._loaders:
            return
        layer = self._layer_index[layer_name]
        stream = self._compute_stream()
        for _, loader in self._loaders:
            loader.wait_layer(layer, stream)
        if self._host_compute_stream is not None:
            assert self._runtime is not None
            self._runtime.synchronize(stream)  # CPU compute: the host waits

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor,
                      attn_metadata: "AttentionMetadata", **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvtierConnectorMetadata)
        if self._storers is None:
            self._storers = []
            for spec in meta.saves:
                self._start_save(spec)
        layer = self._layer_index[layer_name]
        stream = self._compute_stream()
        for _, storer in self._storers:
            storer.layer_done(layer, stream)

    def _mark_bad(self, req_id: str, first_bad_token: int) -> None:
        """Records that this step's KV of `req_id` is not known good from first_bad_token on
        (rounded down to vLLM's block)."""
        first = (first_bad_token // self._block_size) * self._block_size
        self._bad_from[req_id] = min(first, self._bad_from.get(req_id, first))

    def _start_save(self, spec: _SaveSpec) -> None:
        assert self._storers is not None and self._arena is not None
        assert self._cache is not None and self._runtime is not None
        assert self._store_stream is not None
        ns = self._namespace(spec.cache_salt, spec.lora_key, spec.generation)
        if ns is None:
            return
        # Only the chunks before the first block whose load failed (see _bad_from), and before
        # the first with a sliding-window block already let go (never a null block's bytes).
        bad_from = self._bad_from.get(spec.req_id, len(spec.token_ids))
        good_chunks = min(bad_from // self._chunk, live_chunks(
            self._kv_tables(spec.block_ids), self._windows, spec.first_chunk,
            len(spec.token_ids) // self._chunk,
            self._chunk // self._block_size))
        if good_chunks < len(spec.token_ids) // self._chunk:
            self._stats.data["unsafe_chunks"] += max(
                0, len(spec.token_ids) // self._chunk - max(good_chunks, spec.first_chunk))
            if good_chunks <= spec.first_chunk:
                return
            spec = dataclasses.replace(spec, token_ids=spec.token_ids[:good_chunks * self._chunk],
                                       stored_blocks=None)
        storer = kvtier.LayerwiseStorer(self._client, ns, self._arena, self._cache, self._runtime)
        try:
            if storer.start(spec.token_ids, self._kv_tables(spec.block_ids), self._store_stream,
                            first_chunk=spec.first_chunk) > 0:
                self._storers.append((spec, storer))
        except kvtier.Error as e:
            logger.warning("kvtier: save of request %s failed (%s)", spec.req_id, e)

    def wait_for_save(self) -> None:
        meta = self._connector_metadata
        if (self._events_enabled and isinstance(meta, KvtierConnectorMetadata) and meta.saves
                and self._stored_events is None):
            # Every worker reports on a step with saves, even with no event of its own, so
            # that the scheduler counts every worker (vLLM's executor skips a None).
            self._stored_events = []
        for load, loader in self._loaders:
            failed = loader.finish()
            self._load_errors.update(failed)
            self._stats.data["load_error_blocks"] += len(failed)
            failed_set = set(failed)
            positions = [i for i, b in enumerate(load.block_ids[0]) if b in failed_set]
            if positions:
                self._mark_bad(load.req_id, min(positions) * self._block_size)
        self._loaders = []
        for spec, storer in self._storers or []:
            bad_from = self._bad_from.get(spec.req_id)
            if bad_from is not None and bad_from < len(spec.token_ids):
                # A copy failed after the storer started: its chunks from there on hold stale
                # KV. Not finished, the storer aborts its reservation when it is dropped
                # (below, once its copies are done).
                self._stats.data["unsafe_chunks"] += (
                    len(spec.token_ids) // self._chunk - spec.first_chunk)
                continue
            result = storer.finish()
            self._stats.data["stored_tokens"] += result.stored_chunks * self._chunk
            self._stats.data["already_stored_tokens"] += (
                result.already_stored_chunks * self._chunk)
            self._stats.data["dropped_chunks"] += result.dropped_chunks
            if result.fail_open is not None:
                self._stats.data["fail_open_calls"] += 1
            # Announced only when every chunk of the save is in kvtier's DRAM now: stored by
            # this commit, or held already (the reservation pinned those through the commit).
            # A chunk another client is still writing may never be stored: its writer
            # announces it when it commits.
            if (self._stored_events is not None and spec.stored_blocks is not None
                    and result.fail_open is None and result.dropped_chunks == 0
                    and result.being_written_chunks == 0 and result.stored_chunks > 0):
                self._stored_events.extend(block_stored(
                    spec.stored_blocks, len(spec.token_ids) - spec.first_chunk * self._chunk,
                    self._block_size, self._event_specs))
        self._storers = None
        for state in meta.state_saves if isinstance(meta, KvtierConnectorMetadata) else []:
            bad_from = self._bad_from.get(state.req_id, len(state.token_ids))
            if bad_from >= len(state.token_ids):  # else computed on KV whose load failed
                outcome = self._mamba.store(self._client, self._state_namespaces(
                    state.cache_salt, state.lora_key, state.generation), state)
                if outcome != "held":
                    self._stats.data[f"{outcome}_states"] += 1
        self._bad_from.clear()

    def get_kv_connector_kv_cache_events(self) -> Optional[KVConnectorKVEvents]:
        """This worker's BlockStored since the last call, each once; an empty KvtierKVEvents
        after a step whose saves all failed; None when events are off or no save was due."""
        if self._stored_events is None:
            return None
        events = KvtierKVEvents(num_workers=1)
        events.add_events(list(dict.fromkeys(self._stored_events)))  # a duplicate: once
        self._stored_events = None
        return events

    def reset_cache(self) -> bool:
        """vLLM's reset_prefix_cache(reset_connector=True), e.g. after updating the weights in
        place: this engine's requests from now on use namespaces of a new generation (a random
        tag in the model id), so nothing cached before is served to them. Other engines, and
        requests already looked up, keep theirs; kvtierd evicts the old namespaces' chunks as
        space is needed (``kvtierctl evict --namespace`` drops them at once)."""
        self._generation = uuid.uuid4().hex[:16]
        logger.info("kvtier: cache reset; this engine's namespaces are now of generation %s",
                    self._generation)
        return True

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        # Layer-by-layer waits and saves run between graph pieces, never inside a full graph.
        return True

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def get_kv_connector_stats(self) -> Optional[KVConnectorStats]:
        if self._stats.is_empty():
            return None
        stats, self._stats = self._stats, KvtierConnectorStats()
        return stats

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None
                                 ) -> Optional[KVConnectorStats]:
        return KvtierConnectorStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(cls, vllm_config: "VllmConfig", metric_types: dict[type, type],
                           labelnames: list[str],
                           per_engine_labelvalues: dict[int, list[object]]
                           ) -> KvtierPromMetrics:
        return KvtierPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)
