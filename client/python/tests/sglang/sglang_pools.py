"""SGLang's real host pools on CPU tensors (MHATokenToKVPoolHost, MLATokenToKVPoolHost,
MambaPoolHost), and the HiCacheStorageConfig a rank gets, for the KvtierStorage tests."""

from __future__ import annotations

import hashlib
from typing import Any

import torch
from sglang.srt.mem_cache.device_pool_info import (KVBufferLayout, KVBuffers, MHABufferInfo,
                                                   MambaStateBufferInfo, MLABufferInfo)
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

from kvtier.integrations.sglang import KvtierStorage

LAYERS, HEADS, DIM, PAGE, DEVICE_TOKENS = 2, 2, 16, 16, 256
LORA_RANK, ROPE_DIM = 16, 8  # MLA latent: kv_lora_rank + qk_rope_head_dim


def host_pool(layout: str, seed: int | None, dtype: torch.dtype = torch.float16,
              layers: int = LAYERS, head_groups: int = 1) -> MHATokenToKVPoolHost:
    """A host pool of 528 token slots (33 pages), random contents unless seed is None."""
    k = tuple(torch.zeros(DEVICE_TOKENS + PAGE, HEADS, DIM, dtype=dtype) for _ in range(layers))
    v = tuple(torch.zeros(DEVICE_TOKENS + PAGE, HEADS, DIM, dtype=dtype) for _ in range(layers))
    ptrs = [torch.tensor([t.data_ptr() for t in x], dtype=torch.uint64) for x in (k, v)]
    info = MHABufferInfo(buffers=KVBuffers(k=k, v=v, k_data_ptrs=ptrs[0], v_data_ptrs=ptrs[1],
                                           layout=KVBufferLayout.NHD),
                         page_size=PAGE, head_num=HEADS, head_dim=DIM, v_head_dim=DIM,
                         dtype=dtype, device=torch.device("cpu"))
    pool = MHATokenToKVPoolHost(info, 2.0, 0, PAGE, layout, pin_memory=False, device="cpu",
                                device_capacity_tokens=DEVICE_TOKENS, start_layer=0,
                                end_layer=layers, head_group_num=head_groups)
    if seed is not None:
        g = torch.Generator().manual_seed(seed)
        pool.kv_buffer.copy_(torch.randn(pool.kv_buffer.shape, generator=g).half())
    return pool


def mla_pool(layout: str, seed: int | None) -> MLATokenToKVPoolHost:
    """SGLang's MLA host pool (kv_buffer shapes: SGLang's pool_host/mla.py init_kv_buffer)."""
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


def mamba_pool(seed: int | None, temporal_dtype: torch.dtype = torch.float32,
               layout: str = "page_first") -> MambaPoolHost:
    """SGLang's Mamba state host pool (page size 1: one state per slot) of 17 slots: per slot,
    a temporal state [LAYERS, 2, 4, 4] and a conv state [LAYERS, 3, 8] (bf16)."""
    info = MambaStateBufferInfo(temporal=torch.zeros(LAYERS, 8, 2, 4, 4, dtype=temporal_dtype),
                                conv=(torch.zeros(LAYERS, 8, 3, 8, dtype=torch.bfloat16),))
    pool = MambaPoolHost(info, 2.0, 0, device_capacity=8, pin_memory=False, device="cpu",
                         layout=layout)
    if seed is not None:
        g = torch.Generator().manual_seed(seed)
        for buf in (pool.temporal_buffer, *pool.conv_buffer):
            buf.copy_(torch.randn(buf.shape, generator=g).to(buf.dtype))
    return pool


def mamba_state(pool: MambaPoolHost, slot: int) -> torch.Tensor:
    """One slot's temporal and conv state as bytes."""
    return torch.cat([pool.temporal_buffer[slot].contiguous().view(torch.uint8).flatten(),
                      *(c[slot].contiguous().view(torch.uint8).flatten()
                        for c in pool.conv_buffer)])


def storage(socket: str, pool: Any, tp_rank: int = 0, tp_size: int = 1, mla: bool = False,
            metrics: bool = False, pp: tuple[int, int] = (0, 1), cp: tuple[int, int] = (0, 1),
            dp_rank: int = 0, dcp: tuple[int, int] = (0, 1), logical_page: int | None = None,
            **extra: Any) -> KvtierStorage:
    config = HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=pp[0], pp_size=pp[1], attn_cp_rank=cp[0],
        attn_cp_size=cp[1], is_mla_model=mla, enable_storage_metrics=metrics, dp_rank=dp_rank,
        dcp_rank=dcp[0], dcp_size=dcp[1], logical_page_size=logical_page,
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
    buf, s, layout = pool.kv_buffer, slice(page * PAGE, (page + 1) * PAGE), pool.layout
    if isinstance(pool, MLATokenToKVPoolHost):  # shapes: SGLang's pool_host/mla.py
        if layout == "layer_first":  # [layers, size, 1, latent]
            return buf[:, s].clone()
        if layout == "page_first":  # [size, layers, 1, latent]
            return buf[s].transpose(0, 1).clone()
        if layout == "page_first_direct":  # [pages, layers, page, 1, latent]
            return buf[page].clone()
        assert layout == "page_unified"  # [pages, layers, page, latent]
        return buf[page].unsqueeze(2).clone()
    if layout == "layer_first":  # [2, layers, size, heads, dim] (SGLang's pool_host/mha.py)
        return buf[:, :, s].clone()
    if layout == "page_first":  # [2, size, layers, heads, dim]
        return buf[:, s].transpose(1, 2).clone()
    if layout == "page_first_direct":  # [2, pages, layers, page, heads, dim]
        return buf[:, page].clone()
    if layout == "page_head":  # [2, pages, heads, page, layers, dim]
        return buf[:, page].permute(0, 3, 2, 1, 4).clone()
    assert layout == "page_unified"  # [pages, head groups, layers, 2, page, heads in group, dim]
    g = buf[page].permute(2, 1, 3, 0, 4, 5)  # [2, layers, page, groups, heads in group, dim]
    return g.reshape(2, g.shape[1], PAGE, -1, g.shape[-1]).clone()
