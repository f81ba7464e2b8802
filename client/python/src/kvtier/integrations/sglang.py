"""kvtier as an SGLang HiCache storage backend (``HiCacheStorage``, SGLang 0.5.23).

Enable it with::

    python -m sglang.launch_server --model-path MODEL --enable-hierarchical-cache \\
        --page-size 64 --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name": "kvtier",
            "module_path": "kvtier.integrations.sglang", "class_name": "KvtierStorage",
            "interface_v1": 1, "socket": "/tmp/kvtier/kvtierd.sock"}'

``interface_v1: 1`` is required: SGLang then calls the zero-copy batch calls
(``batch_get_v1`` / ``batch_set_v1``) over its registered host pool. Hybrid models (Mamba or
linear-attention state, sliding-window and DSA indexer pools, DeepSeek V4's compressed pools)
also use the v2 pool calls: ``register_mem_host_pool_v2`` registers each auxiliary host pool,
``batch_exists_v2`` answers the prefix every pool can deliver under its hit rule (all pages,
or the trailing pages only), and ``batch_get_v2`` / ``batch_set_v2`` move each pool's pages.
Extra config keys of kvtier's own (optional): ``socket`` (default
``${XDG_RUNTIME_DIR:-/tmp}/kvtier/kvtierd.sock``; ``{tp_rank}`` becomes the rank, for MLA the
DCP rank (0 without DCP), whose shared copy lives on that rank's daemon), ``deadline_ms``
(100), ``model_id`` (default: SGLang's model name), ``kv_dtype`` (``fp8_e4m3`` or
``fp8_e5m2``; required with an fp8 KV cache, which SGLang's host pool stores as uint8).
Pipeline parallelism is refused (not supported yet).

SGLang names each page by its own chained SHA-256 hash, so the backend opens engine-keyed
namespaces (DESIGN.md): one kvtier chunk per SGLang page (``--page-size`` must be at least 8)
named by the namespace and that hash alone (kvtier does not chain pages: the hash already
covers the prefix, so the ``prefix_keys`` SGLang may pass add nothing and are not needed), and
the daemon checks the whole hash on every lookup and read (a mismatch is a miss). Each pool
has a namespace of its own (see ``_sglang_pools``): the model id tagged with the pool's name,
and with the context-parallel (and DCP) rank where SGLang shards a page across those ranks,
so a page of one pool or rank is never served as another's. Data-parallel replicas share
pages (their attention ranks hold the same heads: the KV bytes are equal). SGLang's storage
calls carry no request id, so the backend names one: each ``batch_exists`` (one batch of a
queued request's pages) starts a request, and the loads and stores of its pages belong to it,
so that kvtierd counts the prompt and its hits once (its token hit rate). Each rank names its
own requests: TP ranks sharing one daemon count each request once per rank (the hit rate is
the same; vLLM's ranks share the engine's id and count once). TP ranks of an MHA model have
namespaces of their own. KV pages are copied between SGLang's host pool and kvtierd's arena by
kvtier's gather/scatter (host runtime), in kvtier's payload order, for every host layout
SGLang 0.5.23 has (``layer_first``, ``page_first``, ``page_first_direct``, ``page_head``,
``page_unified`` with one head group; NPU's ``page_first_kv_split`` is refused). MLA models
keep one copy shared by every TP rank (rank 0 of 1; only SGLang's storage writer writes).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
import uuid
from typing import Any, List, Optional

import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
    PoolTransferResult,
)

import kvtier
from kvtier.integrations._sglang_pools import PoolPages, Transfers, open_pool

logger = logging.getLogger(__name__)

__all__ = ["KvtierStorage"]

_OWN_KEYS = {"socket", "deadline_ms", "model_id", "kv_dtype"}
_SGLANG_KEYS = {"backend_name", "module_path", "class_name", "interface_v1"}


# clear() waits for kvtierd's NVMe writes in flight; it is rare, so it may take its time.
_CLEAR_DEADLINE_MS = 10_000


class _RequestNames:
    """Names the engine requests behind SGLang's storage calls, which carry none.

    Each ``batch_exists`` (SGLang's storage query of one batch of a queued request's pages;
    its get and set batches start at the same pages) is a request. Its hit pages wait for
    their ``batch_get_v1``, oldest request first, so two requests that share a prefix are
    each served under their own name; a ``batch_set_v1`` takes the name of the request that
    last asked for its first page. At most ``limit`` requests wait; older ones are dropped
    (a call with no name is a request of its own). Thread-safe."""

    def __init__(self, limit: int = 4096) -> None:
        self._lock = threading.Lock()
        self._limit = limit
        self._backend = uuid.uuid4().hex[:12]  # names no other backend gives
        self._next = 0
        self._waiting: collections.OrderedDict[str, list[str]] = collections.OrderedDict()
        self._by_page: dict[str, collections.deque[str]] = {}
        self._asked: collections.OrderedDict[str, str] = collections.OrderedDict()

    def _fresh(self) -> str:
        self._next += 1
        return f"sglang-{self._backend}-{self._next}"

    def for_query(self) -> str:
        with self._lock:
            return self._fresh()

    def queried(self, name: str, keys: List[str], hits: int) -> None:
        """Records what the query `name` asked for and found (its first `hits` pages)."""
        with self._lock:
            for key in keys:
                self._asked[key] = name
                self._asked.move_to_end(key)
            while len(self._asked) > 16 * self._limit:
                self._asked.popitem(last=False)
            if hits == 0:
                return
            self._waiting.setdefault(name, []).extend(keys[:hits])
            self._waiting.move_to_end(name)
            for key in keys[:hits]:
                self._by_page.setdefault(key, collections.deque()).append(name)
            while len(self._waiting) > self._limit:
                old, pages = self._waiting.popitem(last=False)
                self._forget(old, pages)

    def _forget(self, name: str, pages: List[str]) -> None:
        for key in pages:
            q = self._by_page.get(key)
            if q is None:
                continue
            try:
                q.remove(name)
            except ValueError:
                pass
            if not q:
                del self._by_page[key]

    def for_get(self, keys: List[str]) -> str:
        """The request whose query found keys[0] and that has not loaded it yet."""
        with self._lock:
            q = self._by_page.get(keys[0])
            if not q:
                return self._fresh()
            name = q[0]
            pages = self._waiting.get(name, [])
            loaded = set(keys)
            self._forget(name, [k for k in pages if k in loaded])
            rest = [k for k in pages if k not in loaded]
            if rest:
                self._waiting[name] = rest
            else:
                self._waiting.pop(name, None)
            return name

    def for_set(self, keys: List[str]) -> str:
        with self._lock:
            name = self._asked.get(keys[0])
            return name if name is not None else self._fresh()


def _deadline_ms(extra: dict[str, Any]) -> int:
    value = extra.get("deadline_ms", 100)
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"kvtier: deadline_ms must be an integer, not {value!r}")
    try:
        deadline_ms = int(value)
    except ValueError:
        raise ValueError(f"kvtier: deadline_ms must be an integer, not {value!r}") from None
    if deadline_ms <= 0:
        raise ValueError(f"kvtier: deadline_ms must be positive, not {deadline_ms}")
    return deadline_ms


def _pool_key(name: Any) -> str:
    """A PoolName (or its string) as the key of this backend's pools: 'kv', 'mamba', ..."""
    return str(getattr(name, "value", name))


class KvtierStorage(HiCacheStorage):
    """SGLang HiCache L3 storage on kvtierd (see the module docstring). Thread-safe: SGLang's
    prefetch and backup threads call it concurrently."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Any = None) -> None:
        extra = dict(storage_config.extra_config or {})
        unknown = sorted(set(extra) - _OWN_KEYS - _SGLANG_KEYS)
        if unknown:
            raise ValueError(f"kvtier: unknown hicache storage extra config keys {unknown}; "
                             f"known: {sorted(_OWN_KEYS | _SGLANG_KEYS)}")
        if storage_config.pp_size > 1:
            raise ValueError(f"kvtier: pp_size {storage_config.pp_size} is not supported yet "
                             "(the stages' pages would share one namespace)")
        if not extra.get("interface_v1", 0):  # SGLang's own test (bool(...)): 1 and true
            raise ValueError('kvtier: add "interface_v1": 1 to '
                             "--hicache-storage-backend-extra-config (kvtier implements the "
                             "zero-copy batch_get_v1/batch_set_v1 calls)")
        self._config = storage_config
        self._model = str(extra.get("model_id") or storage_config.model_name or "")
        if not self._model:
            raise ValueError("kvtier: no model name: set model_id in the extra config")
        self._kv_dtype = extra.get("kv_dtype")
        self._tags = self._rank_tags(storage_config)
        # MLA's one shared copy (of its DCP shard) lives on that rank's daemon: every rank asks it.
        rank = storage_config.dcp_rank if storage_config.is_mla_model else storage_config.tp_rank
        socket = str(extra.get("socket", "")).replace("{tp_rank}", str(rank))
        self._socket = socket
        client = kvtier.Client.connect(socket=socket,
                                       deadline_ms=_deadline_ms(extra),
                                       client_name=f"sglang-tp{storage_config.tp_rank}")
        runtime = kvtier.Runtime.host()  # the host pools are CPU memory
        self._io = Transfers(client=client, runtime=runtime, arena=kvtier.GpuArena(runtime),
                             load_stream=runtime.create_stream(),
                             store_stream=runtime.create_stream(),
                             written_stream=runtime.create_stream())
        self._client = client
        self._lock = threading.Lock()  # one transfer at a time: the streams are shared
        self._requests = _RequestNames()
        self._pools: dict[str, PoolPages] = {}  # 'kv' and the auxiliary pools, by PoolName
        self._metrics: dict[str, list[float]] = {"prefetch_pgs": [], "backup_pgs": [],
                                                 "prefetch_bandwidth": [],
                                                 "backup_bandwidth": []}
        logger.info("kvtier storage backend (tp %d of %d) on %s", storage_config.tp_rank,
                    storage_config.tp_size, socket or "the default socket")

    @staticmethod
    def _rank_tags(c: HiCacheStorageConfig) -> dict[str, Any]:
        """Namespace tags of the ranks that hold different bytes of one page: attention
        context parallelism (each CP rank holds a slice of every page) and MLA decode context
        parallelism (each DCP shard, equal across DCP groups of one topology and logical page
        size). TP ranks are namespace fields of their own; DP replicas hold equal bytes."""
        tags: dict[str, Any] = {}
        if c.attn_cp_size > 1:
            tags["cp"] = f"{c.attn_cp_rank}/{c.attn_cp_size}"
        if c.dcp_size > 1:
            tags["dcp"] = f"{c.dcp_rank}/{c.dcp_size}"
            tags["dcp_tp"] = c.tp_size
            tags["dcp_page"] = c.logical_page_size
        return tags

    # ------------------------------------------------------------------ setup

    def _open(self, pool: Any, name: str) -> PoolPages:
        c = self._config
        return open_pool(self._io, pool, self._model, self._tags, bool(c.is_mla_model),
                         (c.tp_rank, c.tp_size), self._kv_dtype, name)

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        super().register_mem_pool_host(mem_pool_host)
        kv = self._open(mem_pool_host, "kv")
        self._pools["kv"] = kv
        logger.info("kvtier: host pool registered (%s, %d layers, page %d): namespace %s",
                    mem_pool_host.layout, kv.ns.num_layers, kv.page, kv.ns.id)

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        """Registers one host pool of SGLang's pool group under its PoolName: the KV pool
        (the one register_mem_pool_host registered, or this one if none was) or an auxiliary
        pool, which gets a namespace of its own. Raises ValueError for a pool kvtier cannot
        copy (named in the message)."""
        super().register_mem_host_pool_v2(host_pool, host_pool_name)
        key = _pool_key(host_pool_name)
        if key == "kv":
            if "kv" not in self._pools or self._pools["kv"].pool is not host_pool:
                self.register_mem_pool_host(host_pool)
            return
        pages = self._open(host_pool, key)
        self._pools[key] = pages
        logger.info("kvtier: host pool %s registered (%s): namespace %s", key,
                    type(host_pool).__name__, pages.ns.id)

    def _kv(self) -> PoolPages:
        kv = self._pools.get("kv")
        if kv is None:
            raise RuntimeError("kvtier: register_mem_pool_host was not called")
        return kv

    def _ready(self) -> kvtier.Namespace:
        return self._kv().ns

    # ------------------------------------------------------------- the calls

    def batch_exists(self, keys: List[str],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        """How many leading pages of `keys` kvtierd holds (0 when it is unreachable)."""
        if not keys:
            return 0
        kv = self._kv()
        name = self._requests.for_query()
        hits = kv.leading(keys, name)
        self._requests.queried(name, keys, hits)
        return hits

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def batch_get_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        """Loads the leading run of `keys` into the host pool at `host_indices` (page-aligned
        token slots, len(keys) * page_size). True for each page loaded, in order."""
        kv = self._kv()
        if not keys:
            return []
        start = time.perf_counter()
        with self._lock:
            ok = kv.load(keys, host_indices, self._requests.for_get(keys))
        self._record("prefetch", ok, kv.ns, start)
        return [i < ok for i in range(len(keys))]

    def batch_set_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        """Stores the pages of `keys` from the host pool at `host_indices`. All True when
        every page is in kvtierd afterwards (stored now or before)."""
        return self._set(self._kv(), keys, host_indices)

    def _set(self, pages: PoolPages, keys: List[str], host_indices: Any) -> List[bool]:
        if not keys:
            return []
        if pages.shared and not self._config.is_storage_writer:
            return [True] * len(keys)  # MLA: another rank writes the shared copy
        start = time.perf_counter()
        # Under the name of the request that asked for these pages: not a prompt of its own.
        with self._lock:
            stored, present = pages.store(keys, host_indices, self._requests.for_set(keys))
        self._record("backup", stored, pages.ns, start)
        return [i < present for i in range(len(keys))]

    # ------------------------------------------------------- the v2 pool calls

    def batch_exists_v2(self, keys: List[str], pool_transfers: Optional[List[PoolTransfer]] = None,
                        extra_info: Optional[HiCacheStorageExtraInfo] = None
                        ) -> PoolTransferResult:
        """The usable prefix of `keys` (SGLang's page hashes of the span): the KV pool's
        leading run, cut by each auxiliary pool in `pool_transfers` under its hit rule.
        ALL_PAGES: the pool must hold every page of the prefix. TRAILING_PAGES: it must hold
        the last len(transfer.keys) pages (at least 1) before the prefix's end, so a prefix
        may end only where its window is complete (restorable_prefix_pages lists those ends;
        kv_hit_pages is the longest one every pool allows). BLOCK_GROUPS never gates the KV
        hit (SGLang's rule) and gets no verdict. A pool not registered allows no prefix."""
        kv = self._kv()
        name = self._requests.for_query()
        kv_pages = kv.leading(keys, name) if keys else 0
        self._requests.queried(name, keys, kv_pages)
        hits: dict[Any, int] = {PoolName.KV: kv_pages} if kv_pages else {}
        restorable = set(range(1, kv_pages + 1))
        for t in pool_transfers or []:
            if not restorable:
                break
            key = _pool_key(t.name)
            if t.hit_policy == PoolHitPolicy.BLOCK_GROUPS:
                continue
            pages = self._pools.get(key)
            if pages is None:
                logger.error("kvtier: pool %s was not registered (register_mem_host_pool_v2)",
                             key)
                restorable = set()
                break
            present = pages.present(keys[:kv_pages], name)
            if t.hit_policy == PoolHitPolicy.TRAILING_PAGES:
                window = max(1, len(t.keys or ()))
                allowed = {n for n in range(1, kv_pages + 1)
                           if all(present[max(0, n - window):n])}
            else:  # ALL_PAGES
                lead = present.index(False) if False in present else kv_pages
                allowed = set(range(1, lead + 1))
            if allowed:
                hits[t.name] = max(allowed)
            restorable &= allowed
        ends = sorted(restorable)
        return PoolTransferResult(ends[-1] if ends else 0, hits, ends)

    def _transfer(self, transfers: List[PoolTransfer], load: bool) -> dict[str, List[bool]]:
        out: dict[str, List[bool]] = {}
        for t in transfers:
            keys = list(t.keys or [])
            pages = self._pools.get(_pool_key(t.name))
            if pages is None:
                logger.error("kvtier: pool %s was not registered (register_mem_host_pool_v2)",
                             _pool_key(t.name))
                out[t.name] = [False] * len(keys)
            elif not load:
                out[t.name] = self._set(pages, keys, t.host_indices)
            elif keys:
                start = time.perf_counter()
                with self._lock:
                    name = (self._requests.for_get(keys) if pages is self._pools["kv"]
                            else self._requests.for_set(keys))
                    ok = pages.load(keys, t.host_indices, name)
                self._record("prefetch", ok, pages.ns, start)
                out[t.name] = [i < ok for i in range(len(keys))]
            else:
                out[t.name] = []
        return out

    def batch_get_v2(self, transfers: List[PoolTransfer],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None
                     ) -> dict[str, List[bool]]:
        """Loads each transfer's pages (transfer.keys, at transfer.host_indices: len(keys)
        pages of the pool's own slots) into its registered pool. Per pool name, True for each
        page loaded: the leading run kvtierd holds."""
        return self._transfer(transfers, load=True)

    def batch_set_v2(self, transfers: List[PoolTransfer],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None
                     ) -> dict[str, List[bool]]:
        """Stores each transfer's pages from its registered pool. Per pool name, True for
        each page kvtierd holds afterwards (stored now or before)."""
        return self._transfer(transfers, load=False)

    def _record(self, kind: str, pages: int, ns: kvtier.Namespace, start: float) -> None:
        if not self._config.enable_storage_metrics or pages == 0:
            return
        seconds = max(time.perf_counter() - start, 1e-9)
        self._metrics[f"{kind}_pgs"].append(pages)
        self._metrics[f"{kind}_bandwidth"].append(pages * ns.payload_bytes / seconds / 1e9)

    # The non-zero-copy calls: SGLang uses them only without interface_v1, which __init__
    # refuses (their flat pages are in SGLang's layout, not kvtier's payload order).
    def get(self, key: str, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> torch.Tensor | None:
        raise NotImplementedError("kvtier implements batch_get_v1 (interface_v1: 1)")

    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> List[torch.Tensor | None] | int:
        raise NotImplementedError("kvtier implements batch_get_v1 (interface_v1: 1)")

    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        raise NotImplementedError("kvtier implements batch_set_v1 (interface_v1: 1)")

    def batch_set(self, keys: List[str], values: Optional[Any] = None,
                  target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        raise NotImplementedError("kvtier implements batch_set_v1 (interface_v1: 1)")

    def clear(self) -> bool:
        """Drops every page of this backend's namespaces (the KV pool's and each auxiliary
        pool's) from kvtierd, in every tier (SGLang calls it for POST
        /hicache/storage-backend/clear; its flush_cache does not). Other namespaces (models,
        TP ranks) keep theirs. False, with a log line, when kvtierd is unreachable, its NVMe
        tier is degraded, or it kept pages that a transfer was reading (call again once it is
        done)."""
        if not self._pools:
            return True  # no pool registered: nothing was stored through this backend
        removed = kept = 0
        try:
            admin = kvtier.AdminClient.connect(socket=self._socket, deadline_ms=_CLEAR_DEADLINE_MS)
            for pages in self._pools.values():
                tiers = admin.evict(namespace=pages.ns.id)
                removed += sum(t["removed"] for t in tiers.values())
                kept += sum(t["kept"] for t in tiers.values())
        except kvtier.Error as e:
            logger.error("kvtier: clear() failed, kvtierd keeps the pages: %s", e)
            return False
        if kept:
            logger.warning("kvtier: clear() dropped %d chunks but %d are being read and stay; "
                           "call it again once the transfers finish", removed, kept)
            return False
        logger.info("kvtier: clear() dropped %d chunks of %d namespaces", removed,
                    len(self._pools))
        return True

    def get_stats(self) -> Any:
        """SGLang's StorageMetrics of the calls since the last get_stats (None unless
        enable_storage_metrics)."""
        if not self._config.enable_storage_metrics:
            return None
        from sglang.srt.observability.metrics_collector import StorageMetrics
        m, self._metrics = self._metrics, {k: [] for k in self._metrics}
        return StorageMetrics(prefetch_pgs=[int(x) for x in m["prefetch_pgs"]],
                              backup_pgs=[int(x) for x in m["backup_pgs"]],
                              prefetch_bandwidth=m["prefetch_bandwidth"],
                              backup_bandwidth=m["backup_bandwidth"])

    def close(self) -> None:
        self._client.close()
