"""A vLLM engine without a GPU or a model: vLLM's real Scheduler with the kvtier connector it
builds from KVTransferConfig, and a worker-side connector driven as vLLM's model runner
drives it, over CPU KV cache tensors allocated by vLLM's own allocate_kv_cache.

Tensor parallelism is simulated by several worker-side connectors, each on a kvtierd of its
own (one daemon per rank, as ``{tp_rank}`` in the socket gives), over the same tensors; their
outputs are merged by vLLM's own KVOutputAggregator, as its executor merges its workers'.
The KV cache events the scheduler publishes are recorded (a publisher in place of vLLM's
null one).

The "model" writes, for every token it computes, KV values that are a function of the token
id, its position and the layer (fake_kv), so a test can tell bit for bit whether a block holds
what this engine computed, what another engine stored, or nothing.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from safetensors.torch import save_file
from vllm.config import (CacheConfig, DeviceConfig, KVEventsConfig, KVTransferConfig,
                         ModelConfig, SchedulerConfig, VllmConfig)
from vllm.distributed.kv_events import EventBatch, EventPublisher, KVCacheEvent
from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,
                                        KVCacheTensor, MLAAttentionSpec)
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager
from vllm.v1.worker.utils import allocate_kv_cache

from kvtier.integrations.vllm import KvtierConnector

LAYERS, KV_HEADS, HEAD_SIZE, BLOCK_SIZE = 2, 2, 16, 16
LATENT = 24  # MLA: one latent vector per token (kv_lora_rank + rope dims, scaled down)
LAYER_NAMES = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]

init_none_hash(sha256)


def write_tiny_model(directory: Path, seed: int = 0) -> str:
    """A Llama config small enough for ModelConfig, and a stand-in weight file (the connector
    fingerprints the weights; this engine never loads them). Another seed: other weights."""
    directory.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    save_file({"model.embed_tokens.weight": torch.randn(64, 64, generator=gen)},
              str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": KV_HEADS,
        "num_hidden_layers": LAYERS, "vocab_size": 32000, "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5, "torch_dtype": "float16", "head_dim": HEAD_SIZE}))
    return str(directory)


def fake_kv(layer: int, position: int, token: int, mla: bool = False) -> torch.Tensor:
    """[KV_HEADS, 2 * HEAD_SIZE] (MLA: [1, LATENT]) fp16 values, exact in fp16 (multiples of
    1/8 below 128)."""
    base = (token * 31 + position * 7 + layer * 3) % 997
    shape = (1, LATENT) if mla else (KV_HEADS, 2 * HEAD_SIZE)
    idx = torch.arange(shape[0] * shape[1], dtype=torch.int64).reshape(shape)
    return (((base + idx * 5) % 1000).to(torch.float32) / 8).to(torch.float16)


@dataclass
class StepResult:
    output: SchedulerOutput
    computed: dict[str, tuple[int, int]]  # req_id -> [first, end) token positions computed
    load_errors: set[int]
    kv_output: KVConnectorOutput  # what the scheduler got (merged over the workers)
    worker_events: list[Optional[list[KVCacheEvent]]]  # per worker, before the merge
    published: list[KVCacheEvent]  # what the scheduler published this step


class RecordingPublisher(EventPublisher):
    """Keeps what the scheduler publishes (in place of the null publisher)."""

    def __init__(self) -> None:
        super().__init__(data_parallel_rank=0)
        self.batches: list[EventBatch] = []

    def publish(self, events: EventBatch) -> None:
        self.batches.append(events)

    def shutdown(self) -> None:
        return


@dataclass
class _Running:
    tokens: list[int]
    block_ids: list[int] = field(default_factory=list)


class Engine:
    """One engine: a scheduler-side and a worker-side connector on one kvtierd."""

    def __init__(self, model_dir: str, socket: str, *, num_blocks: int = 128,
                 chunk_tokens: int = 32, max_batched_tokens: int = 4096,
                 layout: KVCacheLayout = KVCacheLayout.LBHNC,
                 extra: Optional[dict[str, Any]] = None,
                 failure_policy: str = "recompute", mla: bool = False,
                 kv_events: bool = False,
                 worker_sockets: Optional[list[str]] = None,
                 kv_role: str = "kv_both") -> None:
        """worker_sockets: one worker-side connector (a simulated TP rank) per socket.
        Default: one, on `socket`. kv_events: vLLM's enable_kv_cache_events."""
        self.mla = mla

        def vllm_config(sock: str) -> VllmConfig:
            model = ModelConfig(model=model_dir, skip_tokenizer_init=True, dtype="float16",
                                max_model_len=4096)
            cache = CacheConfig(block_size=BLOCK_SIZE)
            cache.num_gpu_blocks = num_blocks
            sched = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=max_batched_tokens,
                                    max_model_len=4096, enable_chunked_prefill=True,
                                    is_encoder_decoder=False)
            # prefetch_wait_ms: each step() schedules the requests added before it, however
            # loaded the machine (a test of the wait itself sets its own).
            config = {"socket": sock, "chunk_tokens": chunk_tokens, "deadline_ms": 2000,
                      "gpu_backend": "host", "prefetch_wait_ms": 2000}
            config.update(extra or {})
            kv = KVTransferConfig(kv_connector="KvtierConnector",
                                  kv_connector_module_path="kvtier.integrations.vllm",
                                  kv_role=kv_role, kv_connector_extra_config=config,
                                  kv_load_failure_policy=failure_policy)
            events = (KVEventsConfig(enable_kv_cache_events=True, publisher="null")
                      if kv_events else None)
            return VllmConfig(model_config=model, cache_config=cache, scheduler_config=sched,
                              device_config=DeviceConfig(device="cpu"), kv_transfer_config=kv,
                              kv_events_config=events)

        self.vllm_config = vllm_config(socket)
        spec: FullAttentionSpec = (
            MLAAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=1, head_size=LATENT,
                             dtype=torch.float16) if mla else
            FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=KV_HEADS, head_size=HEAD_SIZE,
                              dtype=torch.float16))
        page = spec.page_size_bytes
        if layout.is_layer_compact:
            tensor = KVCacheTensor(size=page * num_blocks * LAYERS, layers=LAYER_NAMES,
                                   layer_stride=page * num_blocks, block_stride=page)
        else:  # block-outermost: each block holds every layer's page
            tensor = KVCacheTensor(size=page * num_blocks * LAYERS, layers=LAYER_NAMES,
                                   layer_stride=page, block_stride=page * LAYERS)
        self.kv_cache_config = KVCacheConfig(
            num_blocks=num_blocks, kv_cache_tensors=[tensor],
            kv_cache_groups=[KVCacheGroupSpec(LAYER_NAMES, spec)], kv_cache_layout=layout.name)
        self.scheduler = Scheduler(vllm_config=self.vllm_config,
                                   kv_cache_config=self.kv_cache_config,
                                   structured_output_manager=StructuredOutputManager(
                                       self.vllm_config),
                                   block_size=BLOCK_SIZE, log_stats=True)
        assert isinstance(self.scheduler.connector, KvtierConnector)
        self.publisher = RecordingPublisher()
        self.scheduler.kv_event_publisher = self.publisher
        self.workers: list[KvtierConnector] = []
        for sock in worker_sockets or [socket]:
            config = self.vllm_config if sock == socket else vllm_config(sock)
            self.workers.append(KvtierConnector(config, KVConnectorRole.WORKER,
                                                self.kv_cache_config))
        self.worker = self.workers[0]
        self._aggregator = KVOutputAggregator.from_connector(self.scheduler.connector,
                                                             len(self.workers))
        self.kv_caches = allocate_kv_cache(self.kv_cache_config, torch.device("cpu"), layout)
        for worker in self.workers:
            worker.register_kv_caches(self.kv_caches)
        self._running: dict[str, _Running] = {}
        self._hasher = get_request_block_hasher(BLOCK_SIZE, sha256)

    def request(self, req_id: str, tokens: list[int], max_tokens: int = 1,
                cache_salt: Optional[str] = None, **kw: Any) -> Request:
        """A vLLM Request as the engine makes it (kw: mm_features, lora_request)."""
        return Request(request_id=req_id, prompt_token_ids=list(tokens),
                       sampling_params=SamplingParams(max_tokens=max_tokens),
                       pooling_params=None, block_hasher=self._hasher, cache_salt=cache_salt,
                       **kw)

    def add(self, req_id: str, tokens: list[int], max_tokens: int = 1,
            cache_salt: Optional[str] = None, **kw: Any) -> Request:
        request = self.request(req_id, tokens, max_tokens, cache_salt, **kw)
        self.scheduler.add_request(request)
        return request

    def matched(self, request: Request) -> int:
        """What the scheduler-side connector promises for a new request (asked again while it
        answers None, as vLLM's scheduler does each step)."""
        connector = self.scheduler.connector
        assert connector is not None
        for _ in range(200):
            n, _async = connector.get_num_new_matched_tokens(request, 0)
            if n is not None:
                connector.request_finished(request, [])
                return n
            time.sleep(0.01)
        raise AssertionError("the connector never answered")

    def step(self, *, kill_before_load: Optional[Callable[[], None]] = None,
             kill_before_commit: Optional[Callable[[], None]] = None) -> StepResult:
        """One scheduler step and its forward pass on every worker. kill_before_load runs after
        the workers got the step's metadata; kill_before_commit after every layer was saved,
        before wait_for_save commits."""
        out = self.scheduler.schedule()
        computed: dict[str, tuple[int, int]] = {}
        for new in out.scheduled_new_reqs:
            self._running[new.req_id] = _Running(list(new.prompt_token_ids or []),
                                                 list(new.block_ids[0]))
            first = new.num_computed_tokens
            computed[new.req_id] = (first, first + out.num_scheduled_tokens[new.req_id])
        cached = out.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            run = self._running[rid]
            if cached.new_block_ids[i]:
                if rid in cached.resumed_req_ids:
                    run.block_ids = list(cached.new_block_ids[i][0])
                else:
                    run.block_ids.extend(cached.new_block_ids[i][0])
            first = cached.num_computed_tokens[i]
            computed[rid] = (first, first + out.num_scheduled_tokens[rid])

        meta = out.kv_connector_metadata
        assert meta is not None
        for worker in self.workers:
            worker.bind_connector_metadata(meta)
        if kill_before_load is not None:
            kill_before_load()
        for worker in self.workers:
            worker.start_load_kv(None)  # type: ignore[arg-type]
        for layer, name in enumerate(LAYER_NAMES):
            for worker in self.workers:
                worker.wait_for_layer_load(name)
            for rid, (first, end) in computed.items():
                self._write_kv(layer, rid, first, end)
            for worker in self.workers:
                worker.save_kv_layer(name, self.kv_caches[name], None)  # type: ignore[arg-type]
        if kill_before_commit is not None:
            kill_before_commit()
        kv_outputs = []
        for worker in self.workers:
            worker.wait_for_save()
            kv_outputs.append(KVConnectorOutput(
                invalid_block_ids=worker.get_block_ids_with_load_errors(),
                kv_connector_stats=worker.get_kv_connector_stats(),
                kv_cache_events=worker.get_kv_connector_kv_cache_events()))
            worker.clear_connector_metadata()
        worker_events = [None if o.kv_cache_events is None else
                         list(o.kv_cache_events.get_all_events()) for o in kv_outputs]

        req_ids = list(computed)
        sampled = []
        for rid in req_ids:
            run, end = self._running[rid], computed[rid][1]
            sampled.append([1] if end >= len(run.tokens) else [])  # a token once prefilled
        outputs = [ModelRunnerOutput(req_ids=req_ids,
                                     req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                     sampled_token_ids=sampled, kv_connector_output=kv)
                   for kv in kv_outputs]
        mro = outputs[0] if len(outputs) == 1 else self._aggregator.aggregate(outputs)
        assert mro is not None and mro.kv_connector_output is not None
        kv_output = mro.kv_connector_output
        batches = len(self.publisher.batches)
        self.scheduler.update_from_output(out, mro)
        published = [e for b in self.publisher.batches[batches:] for e in b.events]
        for rid in out.finished_req_ids:
            self._running.pop(rid, None)
        return StepResult(out, computed, kv_output.invalid_block_ids, kv_output, worker_events,
                          published)

    def _write_kv(self, layer: int, rid: str, first: int, end: int) -> None:
        run = self._running[rid]
        cache = self.kv_caches[LAYER_NAMES[layer]]  # [blocks, heads, block_size, content]
        for pos in range(first, min(end, len(run.tokens))):
            block, offset = run.block_ids[pos // BLOCK_SIZE], pos % BLOCK_SIZE
            cache[block, :, offset, :] = fake_kv(layer, pos, run.tokens[pos], self.mla)

    def block_ids(self, rid: str) -> list[int]:
        return list(self._running[rid].block_ids)

    def kv_matches(self, rid: str, tokens: list[int], positions: range) -> bool:
        """Whether every layer holds fake_kv for each position (bit for bit)."""
        blocks = self._running[rid].block_ids
        for layer, name in enumerate(LAYER_NAMES):
            cache = self.kv_caches[name]
            for pos in positions:
                got = cache[blocks[pos // BLOCK_SIZE], :, pos % BLOCK_SIZE, :]
                want = fake_kv(layer, pos, tokens[pos], self.mla)
                if not torch.equal(got.view(torch.int16), want.view(torch.int16)):
                    return False
        return True

    def zero_cache(self) -> None:
        for t in self.kv_caches.values():
            t.zero_()

    def close(self) -> None:
        for worker in self.workers:
            worker.shutdown()
        assert self.scheduler.connector is not None
        self.scheduler.connector.shutdown()
