"""Helpers the vLLM connector tests share: the chunk size, prompts, engines on a kvtierd, and
what a scheduler-side connector published."""

from __future__ import annotations

import torch
from vllm.distributed.kv_events import BlockStored, KVCacheEvent
from vllm.v1.core.kv_cache_utils import ExternalBlockHash, maybe_convert_block_hash
from vllm.v1.request import Request

from engine_harness import BLOCK_SIZE, Engine
from kvtier.integrations.vllm import KvtierConnector
from kvtierd_process import KvtierdProcess

CHUNK = 32


def prompt(seed: int, n: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 32000, (n,), generator=g).tolist()


def dram_chunks(daemon: KvtierdProcess) -> int:
    return [t for t in daemon.admin().stats()["tiers"] if t["name"] == "dram"][0]["chunks"]


def make(engines: list[Engine], model_dir: str, daemon: KvtierdProcess, **kw: object) -> Engine:
    e = Engine(model_dir, daemon.socket, chunk_tokens=CHUNK, **kw)  # type: ignore[arg-type]
    engines.append(e)
    return e


BLOCKS_PER_CHUNK = CHUNK // BLOCK_SIZE


def stored(events: list[KVCacheEvent], medium: str) -> list[BlockStored]:
    return [e for e in events if isinstance(e, BlockStored) and e.medium == medium]


def vllm_hashes(request: Request, num_blocks: int) -> list[ExternalBlockHash]:
    """The request's first block hashes as vLLM's block pool publishes them."""
    assert len(request.block_hashes) >= num_blocks
    return [maybe_convert_block_hash(h) for h in request.block_hashes[:num_blocks]]


def scheduler_connector(engine: Engine) -> KvtierConnector:
    connector = engine.scheduler.connector
    assert isinstance(connector, KvtierConnector)
    return connector
