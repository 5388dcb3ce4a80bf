"""A Llama-style dense decoder: RMSNorm, RoPE, causal attention, SwiGLU, untied head."""

from __future__ import annotations

from .layers import Block, DecoderLM, DenseMLP


def build_dense(shape: dict) -> DecoderLM:
    h, f = shape["hidden_size"], shape["ffn_hidden_size"]
    blocks = [Block(h, shape["num_heads"], DenseMLP(h, f)) for _ in range(shape["num_layers"])]
    return DecoderLM(shape, blocks)
