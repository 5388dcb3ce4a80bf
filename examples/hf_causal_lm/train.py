"""Train a small GPT-2 (Hugging Face ``transformers``, built from a config: no weights are
downloaded) on data.txt, byte-level. A plain training loop over a DataLoader.

    python train.py --batch-size 8 --steps 100
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset
from transformers import GPT2Config, GPT2LMHeadModel

SEQ_LEN = 64
CONFIG = dict(vocab_size=256, n_positions=SEQ_LEN, n_embd=64, n_layer=2, n_head=4,
              resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)


class ByteWindows(Dataset):
    """Every window of SEQ_LEN bytes of the text; labels are the inputs (the model shifts)."""

    def __init__(self, path: Path = Path(__file__).parent / "data.txt") -> None:
        self.data = torch.tensor(list(path.read_bytes()), dtype=torch.long)

    def __len__(self) -> int:
        return len(self.data) - SEQ_LEN

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        window = self.data[i:i + SEQ_LEN]
        return {"input_ids": window, "labels": window}


def make_model() -> GPT2LMHeadModel:
    return GPT2LMHeadModel(GPT2Config(**CONFIG))


def make_loader(batch_size: int, generator: torch.Generator | None = None) -> DataLoader:
    return DataLoader(ByteWindows(), batch_size=batch_size, shuffle=True, drop_last=True,
                      generator=generator)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
    step = 0
    while step < args.steps:
        for batch in make_loader(args.batch_size):
            loss = model(**batch).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if step % 20 == 0:
                print(f"step {step}: loss {loss.item():.4f}")
            step += 1
            if step == args.steps:
                break


if __name__ == "__main__":
    main()
