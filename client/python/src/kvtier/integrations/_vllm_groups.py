"""The vLLM connector's view of a model's KV cache groups (vLLM's hybrid allocator): the kvtier
namespace they make, the order of their layers in a chunk's payload, and kvtier's view of the
engine's per-layer KV cache tensors. A chunk's payload holds every group, one after another in
vLLM's group order, each layer-major (docs/HYBRID.md). Used by kvtier.integrations.vllm."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

import torch
from vllm.model_executor.models.utils import extract_layer_index
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    get_kv_cache_spec_kind,
)

import kvtier
from kvtier.integrations._vllm_plan import _Settings
from kvtier.integrations._weights import namespace_model_id

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig


def group_layer_names(kv_cache_config: "KVCacheConfig") -> list[list[str]]:
    """Each group's layer names, in layer order: the payload order of its layers."""
    return [sorted(g.layer_names, key=extract_layer_index)
            for g in kv_cache_config.kv_cache_groups]


def kv_groups(kv_cache_config: "KVCacheConfig") -> list[int]:
    """The indices of the groups whose KV a chunk's payload holds: all but Mamba state."""
    return [i for i, g in enumerate(kv_cache_config.kv_cache_groups)
            if not isinstance(g.kv_cache_spec, MambaSpec)]


def _window(spec: Any) -> int:
    return spec.sliding_window if isinstance(spec, SlidingWindowSpec) else 0


def sliding_windows(kv_cache_config: "KVCacheConfig") -> list[int]:
    """Each KV group's sliding window in tokens (kv_groups' order), 0 for full attention."""
    groups = kv_cache_config.kv_cache_groups
    return [_window(groups[i].kv_cache_spec) for i in kv_groups(kv_cache_config)]


def load_tables(block_ids: list[list[int]], owned_blocks: int,
                windows: list[int]) -> tuple[list[int], ...]:
    """The block tables (one per group) a load copies into: -1 for the engine's own
    prefix-cache blocks (the first `owned_blocks`, also inside the first chunk copied when its
    hit does not end on a chunk boundary) and for a sliding-window group's null blocks (id 0),
    which lie before its window."""
    return tuple([-1 if i < owned_blocks or (window and b == 0) else b
                  for i, b in enumerate(table)] for table, window in zip(block_ids, windows))


def live_chunks(block_ids: list[list[int]], windows: list[int], first_chunk: int,
                num_chunks: int, blocks_per_chunk: int) -> int:
    """The first chunk from `first_chunk` on (else `num_chunks`) with a block of a
    sliding-window group that is no longer the request's (vLLM's null block 0, or past the
    table): a store stops before it."""
    for c in range(first_chunk, num_chunks):
        for table, window in zip(block_ids, windows):
            blocks = table[c * blocks_per_chunk:(c + 1) * blocks_per_chunk]
            if window and (len(blocks) < blocks_per_chunk or 0 in blocks):
                return c
    return num_chunks


def namespace_spec(vllm_config: "VllmConfig", kv_cache_config: "KVCacheConfig",
                   settings: _Settings, tp_rank: int) -> dict[str, Any]:
    """The open_namespace arguments (less salt and LoRA) of the KV namespace from vLLM's KV
    cache config: every group but Mamba state (_vllm_mamba keeps that apart). Raises
    ValueError naming what kvtier cannot store: a group that is none of full attention,
    sliding window and Mamba state, KV groups of different head shapes, or a chunk longer than
    a sliding window (its first blocks would leave the window before the chunk is stored)."""
    all_groups = kv_cache_config.kv_cache_groups
    groups = [all_groups[i] for i in kv_groups(kv_cache_config)]
    if not groups:
        raise ValueError("kvtier: the model has no attention layers; kvtier keys Mamba state "
                         "on the attention KV it ends")
    spec = groups[0].kv_cache_spec
    for i, group in enumerate(all_groups):
        s = group.kv_cache_spec
        if isinstance(s, MambaSpec):
            continue
        if isinstance(s, SlidingWindowMLASpec) or not isinstance(
                s, (FullAttentionSpec, SlidingWindowSpec)):
            raise ValueError(f"kvtier: KV cache group {i} is {type(s).__name__}; kvtier stores "
                             "full-attention, sliding-window (MLA without a window) and Mamba "
                             "groups")
        if isinstance(s, SlidingWindowSpec) and settings.chunk_tokens > s.sliding_window:
            raise ValueError(f"kvtier: chunk_tokens {settings.chunk_tokens} exceeds the sliding "
                             f"window of KV cache group {i} ({s.sliding_window} tokens): set "
                             f"chunk_tokens to at most {s.sliding_window}")
        shape = (s.num_kv_heads, s.head_size, s.head_size_v, s.dtype, s.block_size,
                 isinstance(s, MLAAttentionSpec))
        first = (spec.num_kv_heads, spec.head_size, spec.head_size_v, spec.dtype,
                 spec.block_size, isinstance(spec, MLAAttentionSpec))
        if shape != first:
            raise ValueError(f"kvtier: KV cache group {i} differs from group 0 in heads, head "
                             "size, dtype, block size or MLA; kvtier needs one KV layout")
    block_size = vllm_config.cache_config.block_size
    if settings.chunk_tokens % block_size != 0:
        raise ValueError(f"kvtier: chunk_tokens {settings.chunk_tokens} is not a multiple of "
                         f"vLLM's block size {block_size}")
    cache_dtype = str(vllm_config.cache_config.cache_dtype)
    kv_dtype: Any = cache_dtype if cache_dtype.startswith("fp8") else spec.dtype
    config = vllm_config.model_config
    model_id = namespace_model_id(settings.model_id, settings.weights_fingerprint,
                                  config.model if config is not None else "",
                                  getattr(config, "revision", None))
    if len(all_groups) > 1:
        # Another grouping of the layers is another payload: never the same namespace. The
        # kinds, windows and sizes, then a digest of which layers each group has.
        names = ";".join(",".join(g) for g in group_layer_names(kv_cache_config))
        model_id += "#kv-groups:" + ",".join(
            f"{get_kv_cache_spec_kind(g.kv_cache_spec).value}"
            f"{'@' + str(w) if w else ''}x{len(g.layer_names)}"
            for g in all_groups for w in [_window(g.kv_cache_spec)]
        ) + "/" + hashlib.sha256(names.encode()).hexdigest()[:16]
    args: dict[str, Any] = dict(model_id=model_id,
                                num_layers=sum(len(g.layer_names) for g in groups),
                                kv_dtype=kv_dtype, chunk_tokens=settings.chunk_tokens)
    if isinstance(spec, MLAAttentionSpec):
        args.update(layout="mla", latent_dim=spec.head_size)
    else:
        if spec.head_size_v not in (None, spec.head_size):
            raise ValueError("kvtier: K and V head sizes differ; not supported")
        tp_size = vllm_config.parallel_config.tensor_parallel_size
        args.update(layout="mha", num_kv_heads=spec.num_kv_heads, head_dim=spec.head_size,
                    tp_rank=tp_rank, tp_size=tp_size)
    return args


def paged_cache(tensors: list[torch.Tensor], head_size: int, mla: bool,
                group_layers: list[int]) -> kvtier.PagedKvCache:
    """kvtier's view of vLLM's per-layer KV cache tensors (in payload order; see the vllm
    module's docstring for the layouts)."""
    t = tensors[0]
    groups = group_layers if len(group_layers) > 1 else None
    if mla:
        if t.dim() == 4 and t.shape[1] == 1:
            return kvtier.PagedKvCache("mla", [x[:, 0] for x in tensors], group_layers=groups)
        if t.dim() == 3:
            return kvtier.PagedKvCache("mla", tensors, group_layers=groups)
    elif t.dim() == 4 and t.shape[3] == 2 * head_size:
        return kvtier.PagedKvCache("vllm_bhnc", tensors, group_layers=groups)
    elif t.dim() == 5 and t.shape[0] == 2:
        return kvtier.PagedKvCache("vllm_flash_attn", tensors, group_layers=groups)
    elif t.dim() == 5 and t.shape[1] == 2:
        return kvtier.PagedKvCache("vllm_flashinfer", tensors, group_layers=groups)
    raise ValueError(f"kvtier: unrecognised KV cache tensor shape {tuple(t.shape)} "
                     f"(mla={mla}, head_size={head_size})")
