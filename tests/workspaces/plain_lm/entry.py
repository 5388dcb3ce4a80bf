"""A plain PyTorch language model (not InfraRSI's reference): the test workspace for patches
proposed for any code. ``build_model(shape, parallel)`` -> module with ``forward(tokens) ->
(logits, aux)`` and its blocks in ``layers``."""

from __future__ import annotations

from .net import TinyLM


def build_model(shape: dict, parallel: dict):
    return TinyLM(shape["vocab_size"], shape["hidden_size"], shape["num_layers"],
                  shape["num_heads"], shape["ffn_hidden_size"], shape["seq_len"])
