"""Building blocks shared by the dense and MoE decoders: RMSNorm, RoPE, attention, SwiGLU.

Written the way much research code is: straightforward and correct, not fast. The attention
materializes the full [B, H, T, T] score matrix and rebuilds its causal mask (and the rotary
tables) on every forward.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.type_as(x) * self.weight


def rotary_tables(seq_len: int, head_dim: int, device, base: float = 10000.0):
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim))
    t = torch.arange(seq_len, device=device).float()
    freqs = torch.outer(t, inv_freq)  # [T, hd/2]
    return freqs.cos(), freqs.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [B, H, T, hd]; rotate pairs (even, odd)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.flatten(-2)


class Attention(nn.Module):
    def __init__(self, hidden: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = hidden // num_heads
        self.wqkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.wo = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.wqkv(x).chunk(3, dim=-1)
        q = q.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)
        k = k.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)
        cos, sin = rotary_tables(T, self.head_dim, x.device)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        # Full score matrix and a causal mask rebuilt on every call.
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool, device=x.device), diagonal=1)
        scores = scores.masked_fill(mask, float("-inf"))
        att = F.softmax(scores, dim=-1)
        y = att @ v
        y = y.transpose(1, 2).reshape(B, T, -1)
        return self.wo(y)


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(hidden, ffn, bias=False)
        self.w3 = nn.Linear(hidden, ffn, bias=False)
        self.w2 = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    """Pre-norm decoder block. ``mlp(x)`` returns ``(y, aux_loss)``; so does the block."""

    def __init__(self, hidden: int, num_heads: int, mlp: nn.Module) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(hidden)
        self.attn = Attention(hidden, num_heads)
        self.mlp_norm = RMSNorm(hidden)
        self.mlp = mlp

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = x + self.attn(self.attn_norm(x))
        y, aux = self.mlp(self.mlp_norm(x))
        return x + y, aux


class DenseMLP(SwiGLU):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return super().forward(x), x.new_zeros(())


class DecoderLM(nn.Module):
    """Token embedding, ``layers`` (the blocks), final norm, untied output head.

    ``forward(tokens[B, T]) -> (logits[B, T, V], aux_loss)``.
    """

    def __init__(self, shape: dict, blocks: list[nn.Module]) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(shape["vocab_size"], shape["hidden_size"])
        self.layers = nn.ModuleList(blocks)
        self.norm = RMSNorm(shape["hidden_size"])
        self.head = nn.Linear(shape["hidden_size"], shape["vocab_size"], bias=False)
        self._init_weights(len(blocks))

    def _init_weights(self, num_layers: int) -> None:
        out_std = 0.02 / math.sqrt(2 * num_layers)
        for name, p in self.named_parameters():
            if p.dim() < 2:
                continue
            std = out_std if name.endswith(("wo.weight", "w2.weight")) else 0.02
            nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.tok_emb(tokens)
        aux_total = x.new_zeros(())
        for block in self.layers:
            x, aux = block(x)
            aux_total = aux_total + aux
        return self.head(self.norm(x)), aux_total
