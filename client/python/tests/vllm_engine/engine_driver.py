"""One real vLLM engine (vLLM's LLM class, engine core and worker in this process) running a real
model on the CPU, driven by a test through JSON lines: one command a line on stdin, one answer a
line on stdout (vLLM's own log goes to stderr).

    python engine_driver.py --model DIR [--kvtier-socket SOCK] [--extra JSON]
        [--kv-role kv_both|kv_producer|kv_consumer] [--block-size 32]
        [--max-batched-tokens 128] [--num-blocks N]

Commands:
- ``{"op": "generate", "requests": [{"prompt": [ids], "max_tokens": 8, "salt": null}],
  "reset": true}``: greedy decoding of the prompts in one batch (``reset`` first empties vLLM's
  own prefix cache, so that ``num_cached_tokens`` counts only what came from kvtier; with
  ``"reset_connector": true`` the connector's too, vLLM's ``reset_prefix_cache``). Answers
  ``{"outputs": [{"tokens": [ids], "num_cached_tokens": n}], "preemptions": n}``.
- ``{"op": "evict_before_next_load", "wait_s": 0.6}``: a fault at the engine boundary. The next
  time the worker starts a load, first wait (so that the scheduler's prefetch ticket lapses),
  then evict every chunk from kvtierd: the chunks leave between the scheduler's lookup and the
  worker's lease, as an eviction, a lapsed ticket or a lost daemon makes them. The answer of the
  next generate carries ``"fault": {"evicted": n}``.
- ``{"op": "quit"}``.

Without ``--kvtier-socket`` the engine runs with no KV connector at all.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Optional

# vLLM's CPU platform, its engine core and worker in this process (so that the fault hook runs
# where the worker does), and 1 GiB of KV space (it takes 20 of 24 GiB otherwise).
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

# Answers go to the stdout this process was given; everything else written to fd 1 (vLLM's log,
# native code) goes to stderr, so that no log line lands among the answers.
_ANSWERS = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
sys.stdout = sys.stderr


def _answer(obj: dict[str, Any]) -> None:
    _ANSWERS.write(json.dumps(obj) + "\n")
    _ANSWERS.flush()


class _Fault:
    armed_wait_s: Optional[float] = None
    socket = ""
    evicted: Optional[int] = None


def _install_fault_hook() -> None:
    import kvtier
    from kvtier.integrations.vllm import KvtierConnector

    real = KvtierConnector.start_load_kv

    def start_load_kv(self: Any, forward_context: Any, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        if _Fault.armed_wait_s is not None and meta.loads:
            time.sleep(_Fault.armed_wait_s)
            _Fault.armed_wait_s = None
            admin = kvtier.AdminClient.connect(_Fault.socket, deadline_ms=5000)
            removed = admin.evict(all=True)
            _Fault.evicted = sum(int(t["removed"]) for t in removed.values())
        real(self, forward_context, **kwargs)

    KvtierConnector.start_load_kv = start_load_kv  # type: ignore[method-assign]


def _without_prefill_checkpoints() -> None:
    """vLLM 0.33's CPU SSM scan returns only each sequence's final state, not the per-chunk
    states that MambaMixer2's prefill checkpoint (the state at the prompt's last block boundary,
    exported from inside the final prefill chunk) indexes, so a Mamba2 model fails there on the
    CPU (IndexError in conv_ssm_forward). Without the checkpoint, vLLM's scheduler ends a
    prefill step at that boundary instead, as for a model that has none."""
    from dataclasses import replace

    from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2
    from vllm.v1.kv_cache_interface import MambaSpec

    real = MambaMixer2.get_kv_cache_spec

    def get_kv_cache_spec(self: Any, vllm_config: Any) -> Any:
        spec = real(self, vllm_config)
        if isinstance(spec, MambaSpec):
            spec = replace(spec, num_prefill_checkpoint_blocks=0)
        return spec

    MambaMixer2.get_kv_cache_spec = get_kv_cache_spec  # type: ignore[method-assign]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--kvtier-socket", default="")
    parser.add_argument("--extra", default="{}", help="kv_connector_extra_config (JSON)")
    parser.add_argument("--kv-role", default="kv_both",
                        choices=["kv_both", "kv_producer", "kv_consumer"])
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--max-batched-tokens", type=int, default=128)
    parser.add_argument("--num-blocks", type=int, default=0, help="0: as vLLM sizes it")
    args = parser.parse_args()

    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    _without_prefill_checkpoints()
    kv_transfer = None
    if args.kvtier_socket:
        _Fault.socket = args.kvtier_socket
        _install_fault_hook()
        extra = {"socket": args.kvtier_socket, **json.loads(args.extra)}
        kv_transfer = KVTransferConfig(kv_connector="KvtierConnector",
                                       kv_connector_module_path="kvtier.integrations.vllm",
                                       kv_role=args.kv_role, kv_connector_extra_config=extra,
                                       kv_load_failure_policy="recompute")
    llm = LLM(model=args.model, skip_tokenizer_init=True, enforce_eager=True, dtype="float32",
              block_size=args.block_size, max_model_len=1024, max_num_seqs=8,
              enable_chunked_prefill=True, max_num_batched_tokens=args.max_batched_tokens,
              num_gpu_blocks_override=args.num_blocks or None, seed=0,
              kv_transfer_config=kv_transfer)
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    preemptions = [0]
    real_preempt = scheduler._preempt_request

    def counting_preempt(*a: Any, **k: Any) -> Any:
        preemptions[0] += 1
        return real_preempt(*a, **k)

    scheduler._preempt_request = counting_preempt
    _answer({"ready": True})

    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "quit":
            break
        if op == "evict_before_next_load":
            _Fault.armed_wait_s = float(cmd.get("wait_s", 0.0))
            _Fault.evicted = None
            _answer({"armed": True})
            continue
        if op != "generate":
            _answer({"error": f"unknown op {op!r}"})
            continue
        if cmd.get("reset", True):
            deadline = time.monotonic() + 30
            reset_connector = bool(cmd.get("reset_connector", False))
            # False while a store is still in flight
            while not llm.reset_prefix_cache(reset_connector=reset_connector):
                if time.monotonic() > deadline:
                    raise RuntimeError("vLLM's prefix cache did not reset in 30 s")
                time.sleep(0.05)
        prompts, params = [], []
        for req in cmd["requests"]:
            prompt = TokensPrompt(prompt_token_ids=list(req["prompt"]))
            if req.get("salt"):
                prompt["cache_salt"] = req["salt"]
            prompts.append(prompt)
            params.append(SamplingParams(temperature=0.0, max_tokens=int(req["max_tokens"]),
                                         ignore_eos=True, detokenize=False))
        before = preemptions[0]
        outputs = llm.generate(prompts, params, use_tqdm=False)
        answer: dict[str, Any] = {
            "outputs": [{"tokens": list(o.outputs[0].token_ids),
                         "num_cached_tokens": int(o.num_cached_tokens or 0)} for o in outputs],
            "preemptions": preemptions[0] - before}
        if _Fault.evicted is not None:
            answer["fault"] = {"evicted": _Fault.evicted}
            _Fault.evicted = None
        _answer(answer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
