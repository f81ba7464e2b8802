"""SGLang's real MHA host pool (MHATokenToKVPoolHost) on CPU tensors, and the
HiCacheStorageConfig a rank gets, for the KvtierStorage tests."""

from __future__ import annotations

import hashlib
from typing import Any

import torch
from sglang.srt.mem_cache.device_pool_info import (KVBufferLayout, KVBuffers, MHABufferInfo,
                                                   MLABufferInfo)
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

from kvtier.integrations.sglang import KvtierStorage

LAYERS, HEADS, DIM, PAGE, DEVICE_TOKENS = 2, 2, 16, 16, 256
LORA_RANK, ROPE_DIM = 16, 8  # MLA latent: kv_lora_rank + qk_rope_head_dim


def host_pool(layout: str, seed: int | None,
              dtype: torch.dtype = torch.float16) -> MHATokenToKVPoolHost:
    """A host pool of 528 token slots (33 pages), random contents unless seed is None."""
    k = tuple(torch.zeros(DEVICE_TOKENS + PAGE, HEADS, DIM, dtype=dtype) for _ in range(LAYERS))
    v = tuple(torch.zeros(DEVICE_TOKENS + PAGE, HEADS, DIM, dtype=dtype) for _ in range(LAYERS))
    ptrs = [torch.tensor([t.data_ptr() for t in x], dtype=torch.uint64) for x in (k, v)]
    info = MHABufferInfo(buffers=KVBuffers(k=k, v=v, k_data_ptrs=ptrs[0], v_data_ptrs=ptrs[1],
                                           layout=KVBufferLayout.NHD),
                         page_size=PAGE, head_num=HEADS, head_dim=DIM, v_head_dim=DIM,
                         dtype=dtype, device=torch.device("cpu"))
    pool = MHATokenToKVPoolHost(info, 2.0, 0, PAGE, layout, pin_memory=False, device="cpu",
                                device_capacity_tokens=DEVICE_TOKENS, start_layer=0,
                                end_layer=LAYERS)
    if seed is not None:
        g = torch.Generator().manual_seed(seed)
        pool.kv_buffer.copy_(torch.randn(pool.kv_buffer.shape, generator=g).half())
    return pool


def mla_pool(layout: str, seed: int | None) -> MLATokenToKVPoolHost:
    """SGLang's MLA host pool: [size, layers, 1, latent] (page_first) or [layers, size, 1, latent]."""
    rows = tuple(torch.zeros(DEVICE_TOKENS + PAGE, 1, LORA_RANK + ROPE_DIM, dtype=torch.float16)
                 for _ in range(LAYERS))
    info = MLABufferInfo(buffers=rows,
                         data_ptrs=torch.tensor([r.data_ptr() for r in rows], dtype=torch.uint64),
                         layer_indices=tuple(range(LAYERS)), device_layer_num=LAYERS,
                         page_size=PAGE, kv_lora_rank=LORA_RANK, qk_rope_head_dim=ROPE_DIM,
                         kv_cache_dim=LORA_RANK + ROPE_DIM, dtype=torch.float16,
                         device=torch.device("cpu"))
    pool = MLATokenToKVPoolHost(info, 2.0, 0, PAGE, layout, pin_memory=False, device="cpu",
                                device_capacity_tokens=DEVICE_TOKENS, start_layer=0,
                                end_layer=LAYERS, target_layer_num=LAYERS)
    if seed is not None:
        g = torch.Generator().manual_seed(seed)
        pool.kv_buffer.copy_(torch.randn(pool.kv_buffer.shape, generator=g).half())
    return pool


def storage(socket: str, pool: Any, tp_rank: int = 0, tp_size: int = 1, mla: bool = False,
            metrics: bool = False, pp: tuple[int, int] = (0, 1), **extra: Any) -> KvtierStorage:
    config = HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=pp[0], pp_size=pp[1], attn_cp_rank=0,
        attn_cp_size=1, is_mla_model=mla, enable_storage_metrics=metrics,
        is_page_first_layout=pool.layout == "page_first", model_name="test/tiny-llama",
        extra_config={"backend_name": "kvtier", "module_path": "kvtier.integrations.sglang",
                      "class_name": "KvtierStorage", "interface_v1": 1, "socket": socket,
                      "deadline_ms": 2000, **extra})
    backend = KvtierStorage(config)
    backend.register_mem_pool_host(pool)
    return backend


def page_keys(n: int, seed: str) -> list[str]:
    """SGLang-style chained SHA-256 page hashes (hex)."""
    keys, prev = [], b""
    for i in range(n):
        prev = hashlib.sha256(prev + f"{seed}:{i}".encode()).digest()
        keys.append(prev.hex())
    return keys


def indices(pages: list[int]) -> torch.Tensor:
    """Host pool token slots of whole pages, as HiCache passes them."""
    return torch.cat([torch.arange(p * PAGE, (p + 1) * PAGE) for p in pages])


def page_kv(pool: Any, page: int) -> torch.Tensor:
    """[2][layers][PAGE][heads][dim] (MLA: [layers][PAGE][1][latent]) of one host page,
    whatever the pool's layout."""
    buf, s = pool.kv_buffer, slice(page * PAGE, (page + 1) * PAGE)
    if isinstance(pool, MLATokenToKVPoolHost):
        return (buf[:, s] if pool.layout == "layer_first" else buf[s].transpose(0, 1)).clone()
    if pool.layout == "layer_first":  # [2, layers, size, heads, dim]
        return buf[:, :, s].clone()
    return buf[:, s].transpose(1, 2).clone()  # page_first: [2, size, layers, heads, dim]
