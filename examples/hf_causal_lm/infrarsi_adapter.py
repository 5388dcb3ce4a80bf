"""InfraRSI adapter: train.py's Hugging Face model, DataLoader and loss."""
import itertools

from .train import make_loader, make_model


def build_model():
    return make_model()

def batches(ctx):  # the loader shuffles with a generator seeded by the task's seed
    for epoch in itertools.count():
        for batch in make_loader(ctx.global_batch_size, ctx.generator(epoch)):
            yield from ctx.shard(batch)

def loss(model, batch):
    return model(**batch).loss

def tokens(batch):
    return batch["input_ids"].numel()
