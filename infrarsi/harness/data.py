"""Synthetic token data with a fixed seed and a fixed order.

The global batch of optimizer step ``s`` depends only on ``(seed, s)`` and the task's work
(``global_batch_size``, ``seq_len``, ``vocab_size``): never on the number of workers or the
micro-batch size. Each rank then takes its contiguous slice of rows, and each micro-batch a
contiguous slice of that.

The sequences are learnable (noisy arithmetic progressions modulo the vocabulary), so the loss
falls during the first steps and a drifted computation shows up in the loss reference.
"""

from __future__ import annotations

import torch

_NOISE = 0.3


def global_batch(seed: int, step: int, global_batch_size: int, seq_len: int, vocab: int):
    """Tokens ``[global_batch_size, seq_len + 1]`` (int64, CPU) of optimizer step ``step``."""
    g = torch.Generator().manual_seed(int(seed) * 1_000_003 + int(step))
    start = torch.randint(0, vocab, (global_batch_size, 1), generator=g)
    stride = torch.randint(1, 17, (global_batch_size, 1), generator=g)
    pos = torch.arange(seq_len + 1).unsqueeze(0)
    tokens = (start + stride * pos) % vocab
    noise = torch.rand(global_batch_size, seq_len + 1, generator=g) < _NOISE
    # Skewed noise (a Zipf-like unigram tail) that a model learns within a few steps.
    u = torch.rand(global_batch_size, seq_len + 1, generator=g)
    random_tokens = (u.pow(4) * vocab).long().clamp_(max=vocab - 1)
    return torch.where(noise, random_tokens, tokens)


def micro_batches(batch: torch.Tensor, rank: int, world_size: int, micro_batch_size: int):
    """This rank's micro-batches of a global batch as ``(inputs, targets)`` pairs."""
    per_rank = batch.shape[0] // world_size
    mine = batch[rank * per_rank:(rank + 1) * per_rank]
    for i in range(0, per_rank, micro_batch_size):
        chunk = mine[i:i + micro_batch_size]
        yield chunk[:, :-1], chunk[:, 1:]
