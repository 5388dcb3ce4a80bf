"""Train the character-level GPT on input.txt: a plain PyTorch training script.

    python train.py --batch-size 8 --steps 200
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

try:  # run as a script, or imported from a package (InfraRSI's adapter)
    from .model import GPT, GPTConfig
except ImportError:
    from model import GPT, GPTConfig

LEARNING_RATE = 1e-3
BLOCK_SIZE = 64


def load_data(path: Path = Path(__file__).parent / "input.txt") -> tuple[torch.Tensor, list[str]]:
    """The text as a tensor of character ids, and the vocabulary."""
    text = path.read_text()
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    return torch.tensor([index[c] for c in text], dtype=torch.long), chars


def get_batch(data: torch.Tensor, batch_size: int, generator: torch.Generator | None = None):
    """``batch_size`` random windows of the text: inputs and next-character targets."""
    starts = torch.randint(len(data) - BLOCK_SIZE - 1, (batch_size,), generator=generator)
    x = torch.stack([data[i:i + BLOCK_SIZE] for i in starts])
    y = torch.stack([data[i + 1:i + 1 + BLOCK_SIZE] for i in starts])
    return x, y


def make_model(vocab_size: int) -> GPT:
    return GPT(GPTConfig(vocab_size=vocab_size, block_size=BLOCK_SIZE))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    torch.manual_seed(1337)
    data, chars = load_data()
    model = make_model(len(chars))
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    for step in range(args.steps):
        x, y = get_batch(data, args.batch_size)
        _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % 50 == 0:
            print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
