"""Train the character-level GPT on input.txt with your own loop; InfraRSI tunes it through
two calls (``infrarsi.prepare`` and ``infrarsi.step``), which do nothing when you run it
yourself:

    python train.py --batch-size 8 --steps 200
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from model import GPT, GPTConfig

import infrarsi

BLOCK_SIZE = 64


def load_data(path: Path = Path(__file__).parent / "input.txt") -> tuple[torch.Tensor, list[str]]:
    text = path.read_text()
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    return torch.tensor([index[c] for c in text], dtype=torch.long), chars


def get_batch(data: torch.Tensor, batch_size: int):
    starts = torch.randint(len(data) - BLOCK_SIZE - 1, (batch_size,))
    x = torch.stack([data[i:i + BLOCK_SIZE] for i in starts])
    y = torch.stack([data[i + 1:i + 1 + BLOCK_SIZE] for i in starts])
    return x, y


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()
    torch.manual_seed(1337)
    data, chars = load_data()
    model = GPT(GPTConfig(vocab_size=len(chars), block_size=BLOCK_SIZE))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loader = (get_batch(data, args.batch_size) for _ in range(args.steps))
    # In an InfraRSI trial: the trial's knobs. Run by you: the settings `infrarsi apply` promoted.
    model, optimizer, loader = infrarsi.prepare(model, optimizer, loader, settings="infrarsi.json")
    for step, (x, y) in enumerate(loader):
        _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        infrarsi.step(loss, tokens=y.numel())
        if step % 50 == 0:
            print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
