"""A tiny Llama written with random weights (fixed seed), for the real-engine tests: no
download, about 3 MB, and context-sensitive (changing one early prompt token changes the
greedy output), so an engine that runs on wrong KV gives a different answer.

vLLM's own ``load_format="dummy"`` draws weights in +-1e-3 and the model then answers one
repeated token whatever the context; these are normal with std 0.1 (the norms' weights 1).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, LAYERS, FFN, VOCAB = 256, 4, 2, 64, 2, 512, 2048


def write_tiny_llama(directory: Path, seed: int, dtype: torch.dtype = torch.bfloat16) -> str:
    """Writes config.json and model.safetensors into `directory` (made if missing) and returns
    its path. The same seed gives the same bytes."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": HIDDEN, "intermediate_size": FFN, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "num_hidden_layers": LAYERS,
        "vocab_size": VOCAB, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "tie_word_embeddings": False, "hidden_act": "silu",
        "torch_dtype": str(dtype).removeprefix("torch."), "bos_token_id": 1,
        "eos_token_id": 2}, indent=1))
    gen = torch.Generator().manual_seed(seed)

    def normal(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * 0.1).to(dtype)

    weights = {"model.embed_tokens.weight": normal(VOCAB, HIDDEN),
               "model.norm.weight": torch.ones(HIDDEN, dtype=dtype),
               "lm_head.weight": normal(VOCAB, HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        weights.update({
            p + "self_attn.q_proj.weight": normal(HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.k_proj.weight": normal(KV_HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.v_proj.weight": normal(KV_HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.o_proj.weight": normal(HIDDEN, HEADS * HEAD_DIM),
            p + "mlp.gate_proj.weight": normal(FFN, HIDDEN),
            p + "mlp.up_proj.weight": normal(FFN, HIDDEN),
            p + "mlp.down_proj.weight": normal(HIDDEN, FFN),
            p + "input_layernorm.weight": torch.ones(HIDDEN, dtype=dtype),
            p + "post_attention_layernorm.weight": torch.ones(HIDDEN, dtype=dtype)})
    save_file(weights, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return str(directory)
