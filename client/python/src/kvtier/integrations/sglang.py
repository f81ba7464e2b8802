"""kvtier as an SGLang HiCache storage backend (``HiCacheStorage``, SGLang 0.5.23).

Enable it with::

    python -m sglang.launch_server --model-path MODEL --enable-hierarchical-cache \\
        --page-size 64 --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name": "kvtier",
            "module_path": "kvtier.integrations.sglang", "class_name": "KvtierStorage",
            "interface_v1": 1, "socket": "/tmp/kvtier/kvtierd.sock"}'

``interface_v1: 1`` is required: SGLang then calls the zero-copy batch calls
(``batch_get_v1`` / ``batch_set_v1``) over its registered host pool, which is all this backend
implements. Extra config keys of kvtier's own (optional): ``socket`` (default
``${XDG_RUNTIME_DIR:-/tmp}/kvtier/kvtierd.sock``; ``{tp_rank}`` becomes the rank, 0 for MLA
whose shared copy lives on rank 0's daemon), ``deadline_ms`` (100), ``model_id`` (default:
SGLang's model name), ``kv_dtype`` (``fp8_e4m3`` or ``fp8_e5m2``; required with an fp8 KV
cache, which SGLang's host pool stores as uint8). Pipeline and context parallelism are
refused (not supported yet).

SGLang names each page by its own chained SHA-256 hash, so the backend opens an
engine-keyed namespace (DESIGN.md): one kvtier chunk per SGLang page (``--page-size`` must be
at least 8) named by the namespace and that hash alone (kvtier does not chain pages: the hash
already covers the prefix), and the daemon checks the whole hash on every lookup and read (a
mismatch is a miss). SGLang's storage calls carry no request id, so the backend names one: each
``batch_exists`` (one batch of a queued request's pages) starts a request, and the
``batch_get_v1`` of its hit pages and the ``batch_set_v1`` of its pages belong to it, so that
kvtierd counts the prompt and its hits once (its token hit rate). Each rank names its own
requests: TP ranks sharing one daemon count each request once per rank (the hit rate is the
same; vLLM's ranks share the engine's id and count once). TP ranks of an MHA model have namespaces of their own. Pages are copied between SGLang's host
pool and kvtierd's arena by kvtier's gather/scatter (host runtime), in kvtier's payload
order, for the ``layer_first`` and ``page_first`` host layouts. MLA models keep one copy
shared by every TP rank (rank 0 of 1; only SGLang's storage writer writes).
"""

from __future__ import annotations

import collections
import hashlib
import logging
import threading
import time
import uuid
from typing import Any, List, Optional

import numpy as np
import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
)

import kvtier
from kvtier.integrations._names import namespace_text

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


def _int_setting(extra: dict[str, Any], key: str, default: int) -> int:
    value = extra.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"kvtier: {key} must be an integer, not {value!r}")
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"kvtier: {key} must be an integer, not {value!r}") from None


def _page_hash(key: str) -> bytes:
    """The 32 bytes a page is named by: SGLang's SHA-256 hex key, or the SHA-256 of any other
    key string."""
    if len(key) == 64:
        try:
            return bytes.fromhex(key)
        except ValueError:
            pass
    return hashlib.sha256(key.encode()).digest()


class KvtierStorage(HiCacheStorage):
    """SGLang HiCache L3 storage on kvtierd (see the module docstring). Thread-safe: SGLang's
    prefetch and backup threads call it concurrently."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Any = None) -> None:
        extra = dict(storage_config.extra_config or {})
        unknown = sorted(set(extra) - _OWN_KEYS - _SGLANG_KEYS)
        if unknown:
            raise ValueError(f"kvtier: unknown hicache storage extra config keys {unknown}; "
                             f"known: {sorted(_OWN_KEYS | _SGLANG_KEYS)}")
        for name, size in (("pp_size", storage_config.pp_size),
                           ("attn_cp_size", storage_config.attn_cp_size),
                           ("dcp_size", storage_config.dcp_size)):
            if size > 1:
                raise ValueError(f"kvtier: {name} {size} is not supported yet (the ranks' pages "
                                 "would share one namespace)")
        if not _int_setting(extra, "interface_v1", 0):
            raise ValueError('kvtier: add "interface_v1": 1 to '
                             "--hicache-storage-backend-extra-config (kvtier implements the "
                             "zero-copy batch_get_v1/batch_set_v1 calls)")
        self._config = storage_config
        self._model_id = namespace_text(str(extra.get("model_id") or
                                             storage_config.model_name or ""))
        if not self._model_id:
            raise ValueError("kvtier: no model name: set model_id in the extra config")
        self._kv_dtype = extra.get("kv_dtype")
        # MLA's one shared copy lives on rank 0's daemon: every rank asks that one.
        rank = 0 if storage_config.is_mla_model else storage_config.tp_rank
        socket = str(extra.get("socket", "")).replace("{tp_rank}", str(rank))
        self._socket = socket
        self._client = kvtier.Client.connect(socket=socket,
                                             deadline_ms=_int_setting(extra, "deadline_ms", 100),
                                             client_name=f"sglang-tp{storage_config.tp_rank}")
        self._runtime = kvtier.Runtime.host()  # the host pool is CPU memory
        self._arena = kvtier.GpuArena(self._runtime)
        self._lock = threading.Lock()  # one transfer at a time: the streams are shared
        self._requests = _RequestNames()
        self._load_stream = self._runtime.create_stream()
        self._store_stream = self._runtime.create_stream()
        self._written_stream = self._runtime.create_stream()  # nothing pending: pool is written
        self._ns: Optional[kvtier.Namespace] = None
        self._cache: Optional[kvtier.PagedKvCache] = None
        self._page = 0
        self._layers = 0
        self._metrics: dict[str, list[float]] = {"prefetch_pgs": [], "backup_pgs": [],
                                                 "prefetch_bandwidth": [],
                                                 "backup_bandwidth": []}
        logger.info("kvtier storage backend (tp %d of %d) on %s", storage_config.tp_rank,
                    storage_config.tp_size, socket or "the default socket")

    # ------------------------------------------------------------------ setup

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        super().register_mem_pool_host(mem_pool_host)
        pool = mem_pool_host
        page, layers, layout = int(pool.page_size), int(pool.layer_num), str(pool.layout)
        mla = self._config.is_mla_model
        buf = pool.kv_buffer
        if mla:  # [layers, size, 1, latent] or [size, layers, 1, latent]
            per_layer = ([buf[i, :, 0] for i in range(layers)] if layout == "layer_first" else
                         [buf[:, i, 0] for i in range(layers)] if layout == "page_first" else None)
            if per_layer is None:
                raise ValueError(f"kvtier: host layout {layout!r} is not supported "
                                 "(layer_first, page_first)")
            latent = int(per_layer[0].shape[-1])
            tensors = [t.unflatten(0, (-1, page)) for t in per_layer]
            self._cache = kvtier.PagedKvCache("mla", tensors)
            spec: dict[str, Any] = dict(layout="mla", latent_dim=latent)
        else:  # K and V: [2, layers, size, heads, dim] or [2, size, layers, heads, dim]
            pairs = ([(buf[0, i], buf[1, i]) for i in range(layers)] if layout == "layer_first"
                     else [(buf[0, :, i], buf[1, :, i]) for i in range(layers)]
                     if layout == "page_first" else None)
            if pairs is None:
                raise ValueError(f"kvtier: host layout {layout!r} is not supported "
                                 "(layer_first, page_first)")
            self._cache = kvtier.PagedKvCache("sglang_mha", pairs, page_size=page)
            spec = dict(layout="mha", num_kv_heads=int(pool.head_num),
                        head_dim=int(pool.head_dim), tp_rank=self._config.tp_rank,
                        tp_size=self._config.tp_size)
        dtype: Any = pool.dtype
        if dtype == torch.uint8:  # SGLang keeps fp8 KV in uint8 storage
            if self._kv_dtype not in ("fp8_e4m3", "fp8_e5m2"):
                raise ValueError('kvtier: the host pool stores fp8 KV as uint8: add "kv_dtype": '
                                 '"fp8_e4m3" or "fp8_e5m2" (as --kv-cache-dtype) to the extra '
                                 "config")
            dtype = self._kv_dtype
        self._ns = self._client.open_namespace(model_id=self._model_id, num_layers=layers,
                                               kv_dtype=dtype, chunk_tokens=page,
                                               engine_keyed=True, **spec)
        self._page, self._layers = page, layers
        logger.info("kvtier: host pool registered (%s, %d layers, page %d): namespace %s",
                    layout, layers, page, self._ns.id)

    # --------------------------------------------------------------- helpers

    def _tokens(self, keys: List[str]) -> np.ndarray:
        out = np.zeros((len(keys), self._page), dtype=np.int32)
        for i, key in enumerate(keys):
            out[i, :8] = np.frombuffer(_page_hash(key), dtype="<i4")
        return out.reshape(-1)

    def _block_ids(self, host_indices: torch.Tensor, num_pages: int) -> Optional[list[int]]:
        """The host pool pages of `num_pages` whole pages of token slots; None (logged) when
        `host_indices` is not num_pages runs of page_size consecutive, page-aligned slots."""
        page = self._page
        if host_indices.dim() != 1 or host_indices.numel() != num_pages * page:
            logger.error("kvtier: %d host indices for %d pages of %d tokens",
                         host_indices.numel(), num_pages, page)
            return None
        runs = host_indices.reshape(num_pages, page).to(torch.int64)
        first = runs[:, 0]
        size = int(self.mem_pool_host.size)
        if bool(((first % page != 0) | (first < 0) | (first + page > size)).any()) or not torch.equal(
                runs - first[:, None], torch.arange(page, dtype=torch.int64).expand_as(runs)):
            logger.error("kvtier: host indices are not whole, page-aligned pages")
            return None
        return (first // page).tolist()

    def _ready(self) -> kvtier.Namespace:
        if self._ns is None or self._cache is None:
            raise RuntimeError("kvtier: register_mem_pool_host was not called")
        return self._ns

    # ------------------------------------------------------------- the calls

    def batch_exists(self, keys: List[str],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        """How many leading pages of `keys` kvtierd holds (0 when it is unreachable)."""
        if not keys:
            return 0
        ns = self._ready()
        name = self._requests.for_query()
        hits = self._client.lookup(ns, self._tokens(keys), request_id=name).num_chunks
        self._requests.queried(name, keys, hits)
        return hits

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def batch_get_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        """Loads the leading run of `keys` into the host pool at `host_indices` (page-aligned
        token slots, len(keys) * page_size). True for each page loaded, in order."""
        ns = self._ready()
        if not keys:
            return []
        assert self._cache is not None
        start = time.perf_counter()
        blocks = self._block_ids(host_indices, len(keys))
        if blocks is None:
            return [False] * len(keys)
        with self._lock:
            loader = kvtier.LayerwiseLoader(self._client, ns, self._arena, self._cache,
                                            self._runtime)
            pages = loader.start_load(self._tokens(keys), blocks, self._load_stream,
                                      request_id=self._requests.for_get(keys))
            pages //= self._page
            failed = set(loader.finish())
        ok = 0
        while ok < pages and blocks[ok] not in failed:
            ok += 1
        self._record("prefetch", ok, ns, start)
        return [i < ok for i in range(len(keys))]

    def batch_set_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        """Stores the pages of `keys` from the host pool at `host_indices`. All True when
        every page is in kvtierd afterwards (stored now or before)."""
        ns = self._ready()
        if not keys:
            return []
        if not self._config.is_storage_writer:
            return [True] * len(keys)  # MLA: another rank writes the shared copy
        assert self._cache is not None
        start = time.perf_counter()
        tokens = self._tokens(keys)
        blocks = self._block_ids(host_indices, len(keys))
        if blocks is None:
            return [False] * len(keys)
        with self._lock:
            storer = kvtier.LayerwiseStorer(self._client, ns, self._arena, self._cache,
                                            self._runtime)
            stored = 0
            if storer.start(tokens, blocks, self._store_stream) > 0:
                for layer in range(self._layers):
                    storer.layer_done(layer, self._written_stream)
                result = storer.finish()
                stored = result.stored_chunks
        # Under the name of the request that asked for these pages: not a prompt of its own.
        present = self._client.lookup(ns, tokens,
                                      request_id=self._requests.for_set(keys)).num_chunks
        self._record("backup", stored, ns, start)
        return [i < present for i in range(len(keys))]

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
        """Drops every page of this backend's namespace from kvtierd, in every tier (SGLang
        calls it for POST /hicache/storage-backend/clear; its flush_cache does not). Other
        namespaces (models, TP ranks) keep theirs. False, with a log line, when kvtierd is
        unreachable, its NVMe tier is degraded, or it kept pages that a transfer was reading
        (call again once it is done)."""
        if self._ns is None:
            return True  # no pool registered: nothing was stored through this backend
        try:
            admin = kvtier.AdminClient.connect(socket=self._socket, deadline_ms=_CLEAR_DEADLINE_MS)
            tiers = admin.evict(namespace=self._ns.id)
        except kvtier.Error as e:
            logger.error("kvtier: clear() failed, kvtierd keeps the pages: %s", e)
            return False
        removed = sum(t["removed"] for t in tiers.values())
        kept = sum(t["kept"] for t in tiers.values())
        if kept:
            logger.warning("kvtier: clear() dropped %d chunks but %d are being read and stay; "
                           "call it again once the transfers finish", removed, kept)
            return False
        logger.info("kvtier: clear() dropped %d chunks of namespace %s", removed, self._ns.id)
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
