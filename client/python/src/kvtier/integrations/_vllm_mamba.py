"""Mamba and linear-attention state for the vLLM connector (docs/HYBRID.md, "Mamba state").

vLLM 0.33 caches a Mamba group's state only in ``mamba_cache_mode="align"`` (prefix caching on)
and only at some block boundaries: where a scheduler step ends, which it lists with the exact
block in ``scheduler_output.kv_connector_block_state.boundary_state_offloads``. So a state is
not part of every chunk's payload. kvtier stores it beside the chunk it ends, as one chunk of a
namespace of its own (the *state namespace*):

- engine-keyed (``engine_keyed=True``, 8-token chunks): a state's key is the 16-byte key of the
  KV chunk it ends (the chained prefix hash of the KV namespace, so it inherits the model, salt,
  LoRA and cache generation), zero-padded to 32 bytes;
- its payload is every Mamba group's state at that boundary, the groups in vLLM's order, each
  group's layers in layer order, each layer the ``C`` bytes vLLM keeps in the block's row
  (conv state then SSM state) padded to ``row_bytes``;
- its model id is the KV namespace's, then ``#mamba-state:`` and 16 hex digits of the SHA-256
  of each Mamba group's layers, state shapes, dtypes and kind, and the conv state's layout, so
  another state layout is another namespace, never a misread payload;
- its tensor-parallel rank and size are the worker's (each rank holds its shard of the state),
  or 0 of 1 for a state every rank holds whole (``tp_replicated``).

A hit of N tokens needs, per Mamba group, the state after token N; the connector cuts the KV
hit back to the last chunk whose state kvtierd holds, and an asynchronous load writes that
state into the request's block at table index ``N / block_size - 1`` (vLLM copies it into the
running block before the forward pass)."""

from __future__ import annotations

import hashlib
import math
import os
from typing import TYPE_CHECKING, Any, Optional

import torch
from vllm.logger import init_logger
from vllm.v1.kv_cache_interface import MambaSpec

import kvtier
from kvtier.integrations._names import engine_key_tokens, namespace_text
from kvtier.integrations._vllm_plan import _StateSave, _Tracker

if TYPE_CHECKING:
    from vllm.v1.kv_cache_interface import KVCacheConfig

logger = init_logger("vllm.kvtier_connector")

STATE_CHUNK_TOKENS = 8  # an engine-keyed chunk's 32-byte key, as 8 int32 "token ids"
_ROW_UNIT = 2 * STATE_CHUNK_TOKENS  # bytes per head_dim unit of an int8 MHA chunk (K and V)


def mamba_groups(kv_cache_config: "KVCacheConfig") -> list[int]:
    """The indices of the Mamba (and linear-attention) groups."""
    return [i for i, g in enumerate(kv_cache_config.kv_cache_groups)
            if isinstance(g.kv_cache_spec, MambaSpec)]


def state_key_tokens(kv_chunk_key: bytes) -> Any:
    """The state namespace's "token ids" of the state ending the KV chunk `kv_chunk_key`."""
    return engine_key_tokens([kv_chunk_key], STATE_CHUNK_TOKENS)


class MambaStates:
    """The state namespace's layout for one model, and the copies in and out of vLLM's Mamba
    blocks (worker side, after ``register``)."""

    def __init__(self, kv_cache_config: "KVCacheConfig", group_names: list[list[str]],
                 tp_rank: int = 0, tp_size: int = 1) -> None:
        self.groups = mamba_groups(kv_cache_config)
        specs = [kv_cache_config.kv_cache_groups[g].kv_cache_spec for g in self.groups]
        for g, spec in zip(self.groups, specs):
            if spec.mamba_cache_mode != "align":
                raise ValueError(
                    f"kvtier: KV cache group {g} is Mamba state in mamba_cache_mode "
                    f"{spec.mamba_cache_mode!r}; kvtier stores it only in 'align' mode, which "
                    "vLLM uses when prefix caching is on (--enable-prefix-caching)")
            if spec.num_speculative_blocks:
                raise ValueError(f"kvtier: KV cache group {g} is Mamba state with speculative "
                                 "decoding; not supported yet")
        self.layer_names = [n for g in self.groups for n in group_names[g]]
        # Each layer's group, by position in self.groups (groups may differ by a layer).
        self._layer_group = [k for k, g in enumerate(self.groups) for _ in group_names[g]]
        replicated = all(getattr(s, "tp_replicated", False) for s in specs)
        self._tp = (0, 1) if replicated else (tp_rank, tp_size)
        self.state_bytes = specs[0].state_content_size_bytes if specs else 0
        if any(s.state_content_size_bytes != self.state_bytes for s in specs):
            raise ValueError("kvtier: the Mamba groups' states differ in size")
        # One layer's row: C bytes padded to a multiple of 16 (an int8 MHA chunk of 8 tokens
        # holds 16 bytes per head_dim unit and head).
        units = max(1, math.ceil(self.state_bytes / _ROW_UNIT))
        self._heads = math.ceil(units / 4096)
        self._head_dim = math.ceil(units / self._heads)
        self.row_bytes = _ROW_UNIT * self._heads * self._head_dim
        conv_layout = os.environ.get("VLLM_SSM_CONV_STATE_LAYOUT", "SD")
        description = ";".join(
            f"{s.mamba_type.name if hasattr(s.mamba_type, 'name') else s.mamba_type}:"
            + ",".join(f"{tuple(shape)}{str(dtype).removeprefix('torch.')}"
                       for shape, dtype in zip(s.shapes, s.dtypes))
            + ":" + ",".join(group_names[g])
            for g, s in zip(self.groups, specs)) + f";conv={conv_layout}"
        self.digest = hashlib.sha256(description.encode()).hexdigest()[:16]
        self._tensors: list[torch.Tensor] = []

    def __bool__(self) -> bool:
        return bool(self.groups)

    def namespace_spec(self, kv_spec: dict[str, Any]) -> dict[str, Any]:
        """The open_namespace arguments (less salt and LoRA) of the state namespace beside the
        KV namespace opened with `kv_spec`."""
        return dict(model_id=namespace_text(f"{kv_spec['model_id']}#mamba-state:{self.digest}"),
                    num_layers=len(self.layer_names), kv_dtype="int8", layout="mha",
                    num_kv_heads=self._heads, head_dim=self._head_dim,
                    chunk_tokens=STATE_CHUNK_TOKENS, tp_rank=self._tp[0], tp_size=self._tp[1],
                    engine_keyed=True)

    # ------------------------------------------------------------------ scheduler

    def hit(self, client: kvtier.Client, kv_ns: kvtier.Namespace, state_ns: kvtier.Namespace,
            tokens: list[int], first_chunk: int, end_chunk: int, deadline_ms: int,
            request_id: str) -> tuple[int, Optional[tuple[int, int]]]:
        """The last chunk end in (first_chunk, end_chunk] (in chunks) whose state kvtierd
        holds, and the prefetch ticket (id, session) that holds that state in DRAM for
        `deadline_ms` or until the worker's load; (0, None) when none."""
        if end_chunk <= first_chunk:
            return 0, None
        keys = kvtier.Client.chunk_keys(kv_ns, tokens[:end_chunk * kv_ns.chunk_tokens])
        for end in range(end_chunk, first_chunk, -1):
            key = state_key_tokens(keys[end - 1])
            if client.lookup(state_ns, key).num_chunks != 1:
                continue
            ticket = client.prefetch(state_ns, key, deadline_ms=deadline_ms,
                                     request_id=request_id)
            if ticket.total_chunks == 1:
                return end, (ticket.id, ticket.session_id) if ticket.id != 0 else None
        return 0, None

    # --------------------------------------------------------------------- worker

    def register(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """vLLM's tensor of each Mamba layer: int8 ``[num_blocks, 1, 1, C]``, dimension 0 the
        block id (its stride is the attention page)."""
        self._tensors = [kv_caches[n] for n in self.layer_names]
        for name, t in zip(self.layer_names, self._tensors):
            if t.dtype != torch.int8 or t.shape[-1] != self.state_bytes or t[0].numel() != (
                    self.state_bytes):
                raise ValueError(f"kvtier: Mamba layer {name}'s KV cache tensor is "
                                 f"{t.dtype} {tuple(t.shape)}, not int8 [blocks, 1, 1, "
                                 f"{self.state_bytes}]")

    def _rows(self, blocks: list[int]) -> list[torch.Tensor]:
        """Each Mamba layer's C-byte row of its group's block, in payload order."""
        return [t[blocks[k]].view(-1) for t, k in zip(self._tensors, self._layer_group)]

    def saves(self, offers: dict[str, list[tuple[int, int, int]]],
              trackers: dict[str, _Tracker], chunk_tokens: int) -> list[_StateSave]:
        """The states this step's forward pass writes at a chunk boundary of a prompt, from
        vLLM's boundary-state hand-offs (``(group, block id, boundary tokens)`` per request;
        exact block ids, as a Mamba group's block table is not append-only): one save per
        boundary that every Mamba group offers."""
        saves = []
        for rid, offered in offers.items():
            tracker = trackers.get(rid)
            if tracker is None:
                continue
            by_boundary: dict[int, dict[int, int]] = {}
            for group, block, boundary in offered:
                by_boundary.setdefault(boundary, {})[group] = block
            for boundary, blocks in sorted(by_boundary.items()):
                if (boundary % chunk_tokens == 0 and 0 < boundary <= len(tracker.token_ids)
                        and all(blocks.get(g, 0) != 0 for g in self.groups)):
                    saves.append(_StateSave(rid, tracker.token_ids[:boundary],
                                            [blocks[g] for g in self.groups], tracker.cache_salt,
                                            tracker.lora_key, tracker.generation))
        return saves

    def store(self, client: kvtier.Client,
              namespaces: Optional[tuple[kvtier.Namespace, kvtier.Namespace]],
              save: _StateSave) -> str:
        """Stores the state after `save.token_ids` (a whole number of KV chunks), read from
        `save.blocks`, in the state namespace (namespaces: the KV one, then the state one):
        "stored", "held" (kvtierd had it: the state this request loaded, say) or "dropped"."""
        if namespaces is None:
            return "dropped"
        payload = torch.zeros(len(self._tensors), self.row_bytes, dtype=torch.int8)
        for row, src in zip(payload, self._rows(save.blocks)):
            row[:self.state_bytes].copy_(src)  # from the GPU: waits for the forward pass
        key = kvtier.Client.chunk_keys(namespaces[0], save.token_ids)[-1]
        try:
            result = client.store(namespaces[1], state_key_tokens(key), payload)
        except kvtier.Error as e:
            logger.warning("kvtier: Mamba state of request %s not stored (%s)", save.req_id, e)
            return "dropped"
        if result.fail_open is not None or result.dropped_chunks:
            return "dropped"
        return "stored" if result.stored_chunks else "held"

    def load(self, client: kvtier.Client,
             namespaces: Optional[tuple[kvtier.Namespace, kvtier.Namespace]],
             tokens: list[int], block_ids: list[list[int]], block_size: int,
             ticket: Optional[kvtier.PrefetchTicket], request_id: str) -> bool:
        """Writes the state after `tokens` (a whole number of KV chunks) into each Mamba
        group's block at table index len(tokens) / block_size - 1 of `block_ids` (every
        group's table), taking over the scheduler's `ticket` (its prefetch of that state, made
        with `request_id`). False, writing nothing, when kvtierd no longer holds it."""
        index = len(tokens) // block_size - 1
        blocks = [block_ids[g][index] if 0 <= index < len(block_ids[g]) else 0
                  for g in self.groups]
        if namespaces is None or 0 in blocks or len(tokens) % namespaces[0].chunk_tokens:
            return False  # vLLM's null block is never written; a state ends a whole chunk
        payload = torch.empty(len(self._tensors), self.row_bytes, dtype=torch.int8)
        key = kvtier.Client.chunk_keys(namespaces[0], tokens)[-1]
        try:
            result = client.load(namespaces[1], state_key_tokens(key), payload, ticket=ticket,
                                 request_id=request_id)
        except kvtier.Error as e:
            logger.warning("kvtier: Mamba state not loaded (%s)", e)
            return False
        if result.num_chunks != 1:
            return False
        for row, dst in zip(payload, self._rows(blocks)):
            dst.copy_(row[:self.state_bytes])
        return True
