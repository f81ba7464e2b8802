"""A tiny Granite-4.0-H-shaped hybrid (GraniteMoeHybridForCausalLM) written with random weights
(fixed seed), for the real-engine test of Mamba state: layers Mamba2, attention, Mamba2,
attention, so that vLLM's hybrid allocator gives it a Mamba group and a full-attention group.
vLLM raises the block size from the 32 the test asks for to 64, so that one attention page
holds the Mamba2 state (8 heads of 32, state 16, conv 4: 19,840 bytes). Context-sensitive as tiny_llama is (projections
of std 0.1, the norms' weights 1)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file

HIDDEN, HEADS, KV_HEADS, LAYERS, FFN, VOCAB = 128, 4, 2, 4, 256, 2048
M_HEADS, M_HEAD_DIM, M_STATE, M_CONV = 8, 32, 16, 4
LAYER_TYPES = ["mamba", "attention"] * (LAYERS // 2)


def write_tiny_granite(directory: Path, seed: int) -> str:
    """Writes config.json and model.safetensors into `directory` (made if missing) and returns
    its path. The same seed gives the same bytes."""
    directory.mkdir(parents=True, exist_ok=True)
    inner = M_HEADS * M_HEAD_DIM
    conv_dim = inner + 2 * M_STATE  # x, B and C of one group
    (directory / "config.json").write_text(json.dumps({
        "architectures": ["GraniteMoeHybridForCausalLM"], "model_type": "granitemoehybrid",
        "hidden_size": HIDDEN, "intermediate_size": FFN, "shared_intermediate_size": FFN,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "num_hidden_layers": LAYERS, "layer_types": LAYER_TYPES, "vocab_size": VOCAB,
        "num_local_experts": 0, "num_experts_per_tok": 0, "mamba_n_heads": M_HEADS,
        "mamba_d_head": M_HEAD_DIM,
        "mamba_d_state": M_STATE, "mamba_n_groups": 1, "mamba_d_conv": M_CONV,
        "mamba_expand": inner // HIDDEN, "mamba_chunk_size": 256, "mamba_conv_bias": True,
        "mamba_proj_bias": False, "position_embedding_type": "rope", "rope_theta": 10000.0,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "hidden_act": "silu",
        "attention_multiplier": 1.0 / math.sqrt(HIDDEN // HEADS), "embedding_multiplier": 1.0,
        "residual_multiplier": 1.0, "logits_scaling": 1.0, "attention_bias": False,
        "tie_word_embeddings": False, "torch_dtype": "float32", "bos_token_id": 1,
        "eos_token_id": 2, "pad_token_id": 0}, indent=1))
    gen = torch.Generator().manual_seed(seed)

    def normal(std: float, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * std

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n)

    weights = {"model.embed_tokens.weight": normal(1.0, VOCAB, HIDDEN),
               "model.norm.weight": ones(HIDDEN), "lm_head.weight": normal(0.1, VOCAB, HIDDEN)}
    for i, kind in enumerate(LAYER_TYPES):
        p = f"model.layers.{i}."
        weights.update({p + "input_layernorm.weight": ones(HIDDEN),
                        p + "post_attention_layernorm.weight": ones(HIDDEN),
                        p + "shared_mlp.input_linear.weight": normal(0.1, 2 * FFN, HIDDEN),
                        p + "shared_mlp.output_linear.weight": normal(0.1, HIDDEN, FFN)})
        if kind == "attention":
            weights.update({
                p + "self_attn.q_proj.weight": normal(0.3, HIDDEN, HIDDEN),
                p + "self_attn.k_proj.weight": normal(0.3, KV_HEADS * HIDDEN // HEADS, HIDDEN),
                p + "self_attn.v_proj.weight": normal(0.1, KV_HEADS * HIDDEN // HEADS, HIDDEN),
                p + "self_attn.o_proj.weight": normal(0.1, HIDDEN, HIDDEN)})
            continue
        # Decay rates between 1 and 16 and steps between 0.01 and 0.1: a state that carries
        # the prompt's early tokens to its end.
        dt = torch.exp(torch.rand(M_HEADS, generator=gen) * math.log(10)) * 0.01
        weights.update({
            p + "mamba.in_proj.weight": normal(0.1, inner + conv_dim + M_HEADS, HIDDEN),
            p + "mamba.conv1d.weight": normal(0.3, conv_dim, 1, M_CONV),
            p + "mamba.conv1d.bias": torch.zeros(conv_dim),
            p + "mamba.A_log": torch.log(1 + torch.rand(M_HEADS, generator=gen) * 15),
            p + "mamba.dt_bias": dt + torch.log(-torch.expm1(-dt)),  # softplus^-1(dt)
            p + "mamba.D": ones(M_HEADS),
            p + "mamba.norm.weight": ones(inner),
            p + "mamba.out_proj.weight": normal(0.1, HIDDEN, inner)})
    save_file(weights, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return str(directory)
