"""TinyLM: a small decoder written the way a hurried research script is.

Every forward it rebuilds the causal mask and the rotary tables, computes attention by hand
(scores, softmax, weighted sum), routes each token to one of four experts with a Python loop
over the experts, and reads a load statistic back to the host with ``.item()``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F  # noqa: F401 - the SDPA rewrite reuses the file's alias
from torch import nn


def rope_cache(length, dim, device):
    freqs = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, device=device).float() / dim))
    angles = torch.outer(torch.arange(length, device=device).float(), freqs)
    return torch.cos(angles), torch.sin(angles)


def rotate(t, cos, sin):
    even, odd = t[..., 0::2], t[..., 1::2]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


class SelfAttention(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.head_width = width // heads
        self.q = nn.Linear(width, width, bias=False)
        self.k = nn.Linear(width, width, bias=False)
        self.v = nn.Linear(width, width, bias=False)
        self.out = nn.Linear(width, width, bias=False)

    def forward(self, h):
        n, length, width = h.shape
        q = self.q(h).view(n, length, self.heads, self.head_width).transpose(1, 2)
        k = self.k(h).view(n, length, self.heads, self.head_width).transpose(1, 2)
        v = self.v(h).view(n, length, self.heads, self.head_width).transpose(1, 2)
        cos, sin = rope_cache(length, self.head_width, h.device)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        allowed = torch.tril(torch.ones(length, length, device=h.device)).bool()
        weights = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_width)
        weights = weights.masked_fill(~allowed, float("-inf"))
        probs = torch.softmax(weights, dim=-1)
        mixed = torch.matmul(probs, v)
        return self.out(mixed.transpose(1, 2).reshape(n, length, width))


class Experts(nn.Module):
    """Top-1 routing over four small MLPs, one Python iteration per expert."""

    def __init__(self, width, hidden, count=4):
        super().__init__()
        self.count = count
        self.gate = nn.Linear(width, count, bias=False)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))
            for _ in range(count))
        self.busiest = 0.0

    def forward(self, h):
        flat = h.reshape(-1, h.shape[-1])
        scores = torch.softmax(self.gate(flat), dim=-1)
        weight, choice = scores.max(dim=-1)
        result = torch.zeros_like(flat)
        for e in range(self.count):
            picked = choice == e
            result[picked] = self.experts[e](flat[picked]) * weight[picked].unsqueeze(-1)
        load = torch.bincount(choice, minlength=self.count).float() / choice.numel()
        self.busiest = load.max().item()
        balance = self.count * (load * scores.mean(0)).sum()
        return result.view_as(h), balance


class Layer(nn.Module):
    def __init__(self, width, heads, hidden):
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attn = SelfAttention(width, heads)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = Experts(width, hidden)

    def forward(self, h):
        h = h + self.attn(self.norm1(h))
        y, aux = self.mlp(self.norm2(h))
        return h + y, aux


class TinyLM(nn.Module):
    def __init__(self, vocab, width, depth, heads, hidden, max_len):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList(Layer(width, heads, hidden) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, tokens):
        h = self.embed(tokens)
        aux = h.new_zeros(())
        for layer in self.layers:
            h, a = layer(h)
            aux = aux + 0.01 * a
        return self.head(self.norm(h)), aux
