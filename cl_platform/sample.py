"""Sampling text from the model as it stands, its fast memory read but never written.

    tokens = sample(model, n=32, length=512, generator=torch.Generator().manual_seed(0))  # (32, 513)

Ancestral sampling at `temperature` from `start` (the `<|endoftext|>` id of the project's
tokenizers, so each sample begins as a document does), one token at a time through the model's
decoding cache (`FwPKMLM.new_cache`): O(length) token-steps instead of the O(length²) of
re-reading the prefix. The memory is read, not written (a write is a step over a whole chunk),
and the call leaves no trace: fast state (read counts included), the layers' call counters, the
write switches and train/eval mode are put back as they were, so a strategy can sample between
experiences without changing what the run does next.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch import Tensor

from cl_platform.model import FwPKMLM


@contextmanager
def reading_only(model: FwPKMLM) -> Iterator[FwPKMLM]:
    """The model in eval mode with every FwPKM write off, for reads that must leave no trace:
    on exit the fast state (read counts included), the layers' call counters, the write switches
    and train/eval mode are put back as they were. Sampling and a strategy's look at its own
    texts (sparse memory finetuning's background) read through it."""
    layers = model.fwpkm_layers()
    saved = (model.snapshot_memory(), [(l.writes_enabled, l.calls, l.writes) for l in layers], model.training)
    model.eval()
    model.set_writes(False)
    try:
        yield model
    finally:
        snap, flags, training = saved
        model.restore_memory(snap)
        for layer, (writes, calls, written) in zip(layers, flags):
            layer.writes_enabled, layer.calls, layer.writes = writes, calls, written
        model.train(training)


@torch.no_grad()
def sample(model: FwPKMLM, n: int, length: int, *, generator: torch.Generator, temperature: float = 1.0,
           start: int = 0, batch_size: int = 64) -> Tensor:
    """(n, length + 1) long on the host: `start`, then `length` sampled tokens per row, by inverse
    transform of one uniform number per token drawn up front from `generator` (a CPU generator):
    the same generator state gives the same rows whatever `batch_size` (rows decoded at once) and
    on every device."""
    for name, value in (("n", n), ("length", length), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"sample: {name} must be a positive int, got {value!r}")
    if not (isinstance(temperature, (int, float)) and temperature > 0):
        raise ValueError(f"sample: temperature must be a number > 0, got {temperature!r}")
    if not 0 <= start < model.config.vocab_size:
        raise ValueError(f"sample: start token {start} is outside the vocabulary (0..{model.config.vocab_size - 1})")
    device = next(model.parameters()).device
    uniform = torch.rand(n, length, generator=generator, dtype=torch.float64, device="cpu")
    with reading_only(model):
        rows = [_sample_rows(model, uniform[i:i + batch_size], float(temperature), start, device)
                for i in range(0, n, batch_size)]
    return torch.cat(rows)


def _sample_rows(model: FwPKMLM, uniform: Tensor, temperature: float, start: int, device: torch.device) -> Tensor:
    b, length = uniform.shape
    cache = model.new_cache()
    out = torch.empty(b, length + 1, dtype=torch.long, device="cpu")
    out[:, 0] = start
    token = out[:, :1].to(device)  # (b, 1)
    for t in range(length):
        logits = model(token, cache=cache)[:, -1].double().cpu()  # (b, V)
        cdf = torch.softmax(logits / temperature, dim=-1).cumsum(-1)
        # the first token whose cumulative probability exceeds u (the clamp catches cdf[-1] < u by rounding)
        out[:, t + 1] = torch.searchsorted(cdf, uniform[:, t:t + 1].contiguous(), right=True).squeeze(1).clamp(max=cdf.shape[1] - 1)
        token = out[:, t + 1:t + 2].to(device)
    return out
