"""A tiny Gemma-2-shaped model written with random weights (fixed seed), for the real-engine
test of hybrid models: 4 layers alternating sliding-window (64 tokens) and full attention, so
that vLLM's hybrid allocator gives it two KV cache groups. Context-sensitive as tiny_llama is;
Gemma adds 1 to its norms' weights (0 here), and embeddings of std 0.02 (0.1 makes it answer
one token whatever the prompt)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, LAYERS, FFN, VOCAB, WINDOW = 256, 4, 2, 64, 4, 512, 2048, 64


def write_tiny_gemma2(directory: Path, seed: int) -> str:
    """Writes config.json and model.safetensors into `directory` (made if missing) and returns
    its path. The same seed gives the same bytes."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({
        "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2",
        "hidden_size": HIDDEN, "intermediate_size": FFN, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "num_hidden_layers": LAYERS,
        "vocab_size": VOCAB, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "hidden_activation": "gelu_pytorch_tanh",
        "query_pre_attn_scalar": HEAD_DIM, "sliding_window": WINDOW,
        "layer_types": ["sliding_attention", "full_attention"] * (LAYERS // 2),
        "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
        "tie_word_embeddings": True, "torch_dtype": "bfloat16", "bos_token_id": 1,
        "eos_token_id": 2, "pad_token_id": 0}, indent=1))
    gen = torch.Generator().manual_seed(seed)

    def normal(std: float, *shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * std).to(torch.bfloat16)

    def zeros(n: int) -> torch.Tensor:
        return torch.zeros(n, dtype=torch.bfloat16)

    weights = {"model.embed_tokens.weight": normal(0.02, VOCAB, HIDDEN),
               "model.norm.weight": zeros(HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        weights.update({
            p + "self_attn.q_proj.weight": normal(0.1, HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.k_proj.weight": normal(0.1, KV_HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.v_proj.weight": normal(0.1, KV_HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.o_proj.weight": normal(0.1, HIDDEN, HEADS * HEAD_DIM),
            p + "mlp.gate_proj.weight": normal(0.1, FFN, HIDDEN),
            p + "mlp.up_proj.weight": normal(0.1, FFN, HIDDEN),
            p + "mlp.down_proj.weight": normal(0.1, HIDDEN, FFN),
            p + "input_layernorm.weight": zeros(HIDDEN),
            p + "post_attention_layernorm.weight": zeros(HIDDEN),
            p + "pre_feedforward_layernorm.weight": zeros(HIDDEN),
            p + "post_feedforward_layernorm.weight": zeros(HIDDEN)})
    save_file(weights, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return str(directory)
