"""The training loss (frozen): token-mean cross-entropy plus the weighted auxiliary loss.

Every micro-batch has the same number of tokens, so ``micro_loss / accumulation_steps`` summed
over a rank's micro-batches is that rank's mean, and the data-parallel average of the gradients
is the gradient of the global mean: the update does not depend on micro-batch size or workers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def training_loss(logits: torch.Tensor, targets: torch.Tensor, aux: torch.Tensor,
                  aux_weight: float) -> torch.Tensor:
    ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))
    return ce + aux_weight * aux.float()
