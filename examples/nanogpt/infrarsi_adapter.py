"""InfraRSI adapter: train.py's own model, data, loss and optimizer."""
import torch

from .train import LEARNING_RATE, get_batch, load_data, make_model

DATA, CHARS = load_data()

def build_model():
    return make_model(len(CHARS))

def batches(ctx):  # step s: a global batch drawn from a generator seeded by (seed, s)
    for step in range(10**9):
        yield from ctx.shard(get_batch(DATA, ctx.global_batch_size, ctx.generator(step)))

def loss(model, batch):
    return model(*batch)[1]

def tokens(batch):
    return batch[1].numel()

def optimizer(model, impl):
    return torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, **impl)
