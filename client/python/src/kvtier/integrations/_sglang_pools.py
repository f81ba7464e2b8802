"""The pages of one SGLang host pool as kvtier chunks, for the HiCache storage backend
(``kvtier.integrations.sglang``): the KV pool and the auxiliary pools of SGLang 0.5.23's v2
pool API (``PoolName``: MAMBA, SWA, INDEXER, DeepSeek V4's compressed pools, draft pools).

Every pool has an engine-keyed kvtier namespace of its own: one chunk per SGLang page, named
by the page's SHA-256 hash (its first 8 int32 "token ids"). Two ways to move a page:

- ``KvPages``: MHA and MLA host pools (``MHATokenToKVPoolHost``, ``MLATokenToKVPoolHost``;
  the KV pool, SWA and draft pools) in any host layout SGLang 0.5.23 has for them, copied by
  kvtier's gather/scatter in kvtier's payload order, so a page stored from one layout loads
  into another.
- ``FlatPages``: any other pool (Mamba state, the DSA indexer, DeepSeek V4 pools), through
  the pool's own ``get_data_page(flat=True)`` / ``set_from_flat_data_page``, the bytes
  SGLang's own file backend stores. Their byte order is the pool's, so the pool's class,
  dtypes and layout are part of its namespace.

Not thread-safe by itself: the backend holds its lock around transfers.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import Any, List, Optional

import numpy as np
import torch
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

import kvtier
from kvtier.integrations._names import engine_key_tokens, namespace_text

logger = logging.getLogger(__name__)

# Host layouts kvtier copies without staging (SGLang 0.5.23, pool_host/mha.py and mla.py).
MHA_LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head", "page_unified")
MLA_LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_unified")


def page_hash(key: str) -> bytes:
    """The 32 bytes a page is named by: SGLang's SHA-256 hex key, or the SHA-256 of any other
    key string."""
    if len(key) == 64:
        try:
            return bytes.fromhex(key)
        except ValueError:
            pass
    return hashlib.sha256(key.encode()).digest()


def page_tokens(keys: List[str], chunk_tokens: int) -> np.ndarray:
    """[len(keys) * chunk_tokens] int32: each page's hash as its first 8 'token ids'."""
    return engine_key_tokens([page_hash(key) for key in keys], chunk_tokens)


def model_field(model_id: str, **tags: Any) -> str:
    """The namespace's model_id field: the model id, then '#' and the tags that set this
    namespace apart (pool name, context-parallel rank, dtypes), e.g.
    ``org/model#pool=mamba;cp=1/2``. Without tags, the model id alone (the namespaces of
    earlier releases). A model id that holds '#' is replaced by its SHA-256 first, so a tagged
    field never equals another model's id."""
    if "#" in model_id:
        model_id = "sha256:" + hashlib.sha256(model_id.encode("utf-8", "surrogatepass")).hexdigest()
    parts = [f"{k}={v}" for k, v in tags.items() if v not in (None, "")]
    return namespace_text(model_id + ("#" + ";".join(parts) if parts else ""))


def host_pages(host_indices: Any, num_pages: int, page: int, size: int) -> Optional[list[int]]:
    """The first token slot of each of `num_pages` whole pages of `page` slots; None (logged)
    when `host_indices` is not num_pages runs of consecutive, page-aligned slots below `size`."""
    if not isinstance(host_indices, torch.Tensor) or host_indices.dim() != 1 or \
            host_indices.numel() != num_pages * page:
        logger.error("kvtier: %s host indices for %d pages of %d slots",
                     getattr(host_indices, "numel", lambda: None)(), num_pages, page)
        return None
    runs = host_indices.reshape(num_pages, page).to(torch.int64)
    first = runs[:, 0]
    if bool(((first % page != 0) | (first < 0) | (first + page > size)).any()) or not torch.equal(
            runs - first[:, None], torch.arange(page, dtype=torch.int64).expand_as(runs)):
        logger.error("kvtier: host indices are not whole, page-aligned pages")
        return None
    return first.tolist()


@dataclass
class Transfers:
    """What every pool's copies share: the client, the host runtime, its arena and streams."""
    client: kvtier.Client
    runtime: kvtier.Runtime
    arena: kvtier.GpuArena
    load_stream: kvtier.Stream
    store_stream: kvtier.Stream
    written_stream: kvtier.Stream  # nothing pending on it: the host pool is written


def _storage_dtype(pool: Any, kv_dtype: Optional[str]) -> Any:
    dtype: Any = pool.dtype
    if dtype == torch.uint8:  # SGLang keeps fp8 KV in uint8 storage
        if kv_dtype not in ("fp8_e4m3", "fp8_e5m2"):
            raise ValueError('kvtier: the host pool stores fp8 KV as uint8: add "kv_dtype": '
                             '"fp8_e4m3" or "fp8_e5m2" (as --kv-cache-dtype) to the extra config')
        dtype = kv_dtype
    return dtype


def _mha_layers(pool: MHATokenToKVPoolHost) -> tuple[str, list[Any], Optional[int]]:
    """(PagedKvCache kind, per-layer tensors, page_size) of an MHA host pool: views of its
    kv_buffer, whose shape depends on the layout (pool_host/mha.py init_kv_buffer)."""
    buf, layers, layout = pool.kv_buffer, int(pool.layer_num), str(pool.layout)
    if layout == "layer_first":  # [2, layers, size, heads, dim]
        return "sglang_mha", [(buf[0, i], buf[1, i]) for i in range(layers)], int(pool.page_size)
    if layout == "page_first":  # [2, size, layers, heads, dim]
        return ("sglang_mha", [(buf[0, :, i], buf[1, :, i]) for i in range(layers)],
                int(pool.page_size))
    if layout == "page_first_direct":  # [2, pages, layers, page, heads, dim]
        return "vllm_flash_attn", [buf[:, :, i] for i in range(layers)], None
    if layout == "page_head":  # [2, pages, heads, page, layers, dim]
        return "vllm_flash_attn", [buf[:, :, :, :, i].transpose(2, 3) for i in range(layers)], None
    if layout == "page_unified":  # [pages, head groups, layers, 2, page, heads in group, dim]
        if buf.shape[1] != 1:
            raise ValueError(f"kvtier: host layout page_unified with {buf.shape[1]} head groups "
                             "is not supported (one head group is)")
        return "vllm_flashinfer", [buf[:, 0, i] for i in range(layers)], None
    raise ValueError(f"kvtier: host layout {layout!r} is not supported ({', '.join(MHA_LAYOUTS)})")


def _mla_layers(pool: MLATokenToKVPoolHost) -> list[Any]:
    """Per-layer [pages, page, latent] views of an MLA host pool's kv_buffer."""
    buf, layers, layout, page = pool.kv_buffer, int(pool.layer_num), str(pool.layout), \
        int(pool.page_size)
    if layout == "layer_first":  # [layers, size, 1, latent]
        return [buf[i, :, 0].unflatten(0, (-1, page)) for i in range(layers)]
    if layout == "page_first":  # [size, layers, 1, latent]
        return [buf[:, i, 0].unflatten(0, (-1, page)) for i in range(layers)]
    if layout == "page_first_direct":  # [pages, layers, page, 1, latent]
        return [buf[:, i, :, 0] for i in range(layers)]
    if layout == "page_unified":  # [pages, layers, page, latent]
        return [buf[:, i] for i in range(layers)]
    raise ValueError(f"kvtier: host layout {layout!r} is not supported ({', '.join(MLA_LAYOUTS)})")


class PoolPages:
    """One host pool's pages in one kvtier namespace. Subclasses move the bytes."""

    def __init__(self, io: Transfers, pool: Any, ns: kvtier.Namespace, page: int,
                 shared: bool) -> None:
        self.io, self.pool, self.ns, self.page = io, pool, ns, page
        self.shared = shared  # one copy for every TP rank, written by SGLang's writer only

    def tokens(self, keys: List[str]) -> np.ndarray:
        return page_tokens(keys, int(self.ns.chunk_tokens))

    def leading(self, keys: List[str], name: str) -> int:
        """How many leading pages of `keys` kvtierd holds (0 when unreachable)."""
        if not keys:
            return 0
        return int(self.io.client.lookup(self.ns, self.tokens(keys), request_id=name).num_chunks)

    def present(self, keys: List[str], name: str) -> list[bool]:
        """Whether kvtierd holds each page of `keys`: one lookup per run of held pages (pages
        are named by their own hash, so a run may start anywhere)."""
        out, i = [False] * len(keys), 0
        while i < len(keys):
            run = self.leading(keys[i:], name)
            out[i:i + run] = [True] * run
            i += run + 1
        return out

    def slots(self, keys: List[str], host_indices: Any) -> Optional[list[int]]:
        return host_pages(host_indices, len(keys), self.page, int(self.pool.size))

    def load(self, keys: List[str], host_indices: Any, name: str) -> int:
        """Loads the leading run of `keys` into the pool at `host_indices` (len(keys) pages of
        token slots); returns the pages loaded."""
        slots = self.slots(keys, host_indices)
        return 0 if slots is None or not keys else self._load(keys, slots, name)

    def store(self, keys: List[str], host_indices: Any, name: str) -> tuple[int, int]:
        """Stores the pages of `keys` from `host_indices`. Returns (pages written now, leading
        pages kvtierd holds afterwards)."""
        slots = self.slots(keys, host_indices)
        if slots is None or not keys:
            return 0, 0
        written = self._store(keys, slots)
        return written, self.leading(keys, name)

    def _load(self, keys: List[str], slots: list[int], name: str) -> int:
        raise NotImplementedError

    def _store(self, keys: List[str], slots: list[int]) -> int:
        raise NotImplementedError


class KvPages(PoolPages):
    """An MHA or MLA host pool, copied by kvtier's gather/scatter in payload order."""

    def __init__(self, io: Transfers, pool: Any, ns: kvtier.Namespace, cache: Any,
                 shared: bool) -> None:
        super().__init__(io, pool, ns, int(pool.page_size), shared)
        self.cache = cache

    def _load(self, keys: List[str], slots: list[int], name: str) -> int:
        blocks = [s // self.page for s in slots]
        loader = kvtier.LayerwiseLoader(self.io.client, self.ns, self.io.arena, self.cache,
                                        self.io.runtime)
        pages = loader.start_load(self.tokens(keys), blocks, self.io.load_stream,
                                  request_id=name) // self.page
        failed = set(loader.finish())
        ok = 0
        while ok < pages and blocks[ok] not in failed:
            ok += 1
        return ok

    def _store(self, keys: List[str], slots: list[int]) -> int:
        blocks = [s // self.page for s in slots]
        storer = kvtier.LayerwiseStorer(self.io.client, self.ns, self.io.arena, self.cache,
                                        self.io.runtime)
        if storer.start(self.tokens(keys), blocks, self.io.store_stream) == 0:
            return 0
        for layer in range(int(self.ns.num_layers)):
            storer.layer_done(layer, self.io.written_stream)
        return int(storer.finish().stored_chunks)


class FlatPages(PoolPages):
    """Any host pool with get_data_page / set_from_flat_data_page, as its flat page bytes
    (zero-padded to the namespace's payload)."""

    def __init__(self, io: Transfers, pool: Any, ns: kvtier.Namespace, page_bytes: int,
                 page_dtype: torch.dtype, shared: bool) -> None:
        super().__init__(io, pool, ns, int(getattr(pool, "page_size", 1) or 1), shared)
        self.page_bytes, self.page_dtype = page_bytes, page_dtype

    def _load(self, keys: List[str], slots: list[int], name: str) -> int:
        out = np.zeros((len(keys), int(self.ns.payload_bytes)), dtype=np.uint8)
        got = int(self.io.client.load(self.ns, self.tokens(keys), out, request_id=name).num_chunks)
        for i in range(got):
            page = torch.from_numpy(out[i, :self.page_bytes]).view(self.page_dtype)
            self.pool.set_from_flat_data_page(slots[i], page)
        return got

    def _store(self, keys: List[str], slots: list[int]) -> int:
        data = np.zeros((len(keys), int(self.ns.payload_bytes)), dtype=np.uint8)
        for i, slot in enumerate(slots):
            page = self.pool.get_data_page(slot, flat=True).contiguous().view(torch.uint8)
            if page.numel() != self.page_bytes:
                logger.error("kvtier: a %s page has %d bytes, not %d", type(self.pool).__name__,
                             page.numel(), self.page_bytes)
                return 0
            data[i, :self.page_bytes] = page.cpu().numpy()
        return int(self.io.client.store(self.ns, self.tokens(keys), data).stored_chunks)


def _flat_shape(num_bytes: int) -> dict[str, int]:
    """An int8 'mha' shape of 8-token chunks whose payload (layers * 2 * 8 * heads * head_dim
    bytes) holds `num_bytes`, padding at most 16 * head_dim - 1 bytes."""
    units = max(1, -(-num_bytes // 16))
    head_dim = min(units, 4096)
    rest = -(-units // head_dim)
    heads = min(rest, 1024)
    layers = -(-rest // heads)
    return dict(num_layers=layers, num_kv_heads=heads, head_dim=head_dim)


def open_pool(io: Transfers, pool: Any, model: str, tags: dict[str, Any], mla_model: bool,
              tp: tuple[int, int], kv_dtype: Optional[str], pool_name: str) -> PoolPages:
    """The pages of host pool `pool` in a namespace of their own: the model field tagged with
    `tags` (and, for other pools than the KV pool, the pool's name). `tp` is this rank (rank,
    size). MLA pools and, in an MLA model, the other rank-replicated pools (all but Mamba
    state and MHA pools, whose heads are the rank's own) are one copy for all ranks, stored by
    SGLang's storage writer."""
    if pool_name != "kv":
        tags = {"pool": pool_name, **tags}
    mha = isinstance(pool, MHATokenToKVPoolHost)
    mla = isinstance(pool, MLATokenToKVPoolHost)
    shared = mla or (mla_model and pool_name != "mamba" and not mha)
    rank, size = (0, 1) if shared else tp
    if mha or mla:
        if mla:
            layers = _mla_layers(pool)
            cache = kvtier.PagedKvCache("mla", layers)
            spec: dict[str, Any] = dict(layout="mla", latent_dim=int(layers[0].shape[-1]))
        else:
            kind, layers, page = _mha_layers(pool)
            cache = kvtier.PagedKvCache(kind, layers, page_size=page)
            spec = dict(layout="mha", num_kv_heads=int(pool.head_num),
                        head_dim=int(pool.head_dim), tp_rank=rank, tp_size=size)
        ns = io.client.open_namespace(model_id=model_field(model, **tags),
                                      num_layers=int(pool.layer_num),
                                      kv_dtype=_storage_dtype(pool, kv_dtype),
                                      chunk_tokens=int(pool.page_size), engine_keyed=True,
                                      **spec)
        return KvPages(io, pool, ns, cache, shared)
    if not (hasattr(pool, "get_data_page") and hasattr(pool, "set_from_flat_data_page")):
        raise ValueError(f"kvtier: host pool {type(pool).__name__} ({pool_name}) has no flat "
                         "pages (get_data_page / set_from_flat_data_page)")
    dummy = pool.get_dummy_flat_data_page()
    page_bytes = int(dummy.numel() * dummy.element_size())
    dtypes = sorted({str(getattr(pool, a)).replace("torch.", "")
                     for a in ("dtype", "conv_dtype", "temporal_dtype", "indexer_dtype")
                     if getattr(pool, a, None) is not None})
    if "uint8" in dtypes and kv_dtype:
        dtypes = [kv_dtype if d == "uint8" else d for d in dtypes]
    tags = {**tags, "class": type(pool).__name__, "layout": getattr(pool, "layout", None),
            "dtype": ",".join(dtypes), "bytes": page_bytes}
    ns = io.client.open_namespace(model_id=model_field(model, **tags), kv_dtype="int8",
                                  layout="mha", chunk_tokens=8, tp_rank=rank, tp_size=size,
                                  engine_keyed=True, **_flat_shape(page_bytes))
    return FlatPages(io, pool, ns, page_bytes, dummy.dtype, shared)
