"""Static product-key memory (PKM): semantic memory with trainable keys and values.

    pkm = PKM(d_model=256, config=PKMConfig(heads=4, topk=32))
    h = h + pkm(h)                       # in place of the block's MLP

The FwPKM layer's product-key lookup (`cl_platform.memory.product_keys`, docs/fwpkm.md, "Read", step
4), but keys and values are ordinary parameters trained by the language-model loss, there are
several heads and a larger top-k. It replaces the MLP of a block (Lample et al. 2019, "Large
Memory Layers with Product Keys"). The value table is an `nn.EmbeddingBag` with `sparse=True`, so
one step only touches the rows that were read; train it with `cl_platform.optim.MixedAdamW`
(AdamW cannot take sparse gradients).

Shape letters:
    B batch, T time, H heads, S sub-keys per codebook, N = S² slots, k top-k,
    d model width, d_k query/key width per head (two halves of d_k/2), d_v value width.
"""

import math
from dataclasses import dataclass
from typing import get_args

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cl_platform.check import check, is_int
from cl_platform.memory.norm import RMSNorm
from cl_platform.memory.product_keys import IDW_EPS, Lookup, Score, product_key_lookup


@dataclass
class PKMConfig:
    """A static PKM. Defaults are the CPU-sized (small) configuration."""

    num_subkeys: int = 128  # S, slots N = S²
    d_key: int = 128  # d_k per head (even: split into two halves, one per codebook)
    d_value: int = 256  # d_v, width of the value table (projected back to d by out_proj)
    heads: int = 4  # H; each head has its own query and keys, all share one value table
    topk: int = 32  # k, per codebook and final
    # "idw" (s = −log(ε + ‖q−K‖²), keys act as cluster centres, as in FwPKM) or "dot" (s = q·K,
    # Lample et al.). Default idw: without a batch-norm on the queries, dot scores let keys grow.
    score: Score = "idw"

    def __post_init__(self):
        for name in ("num_subkeys", "d_key", "d_value", "heads", "topk"):
            check(is_int(getattr(self, name), 1), self, name, "must be a positive int")
        check(self.d_key % 2 == 0, self, "d_key", "must be even (two codebook halves)")
        check(self.topk <= self.num_subkeys, self, "topk", f"must be <= num_subkeys={self.num_subkeys}")
        check(self.score in get_args(Score), self, "score", f"must be one of {get_args(Score)}")

    @property
    def num_slots(self) -> int:
        return self.num_subkeys**2


class PKM(nn.Module):
    """x (B, T, d) -> residual update (B, T, d); the caller does h = h + pkm(h).

    The module normalises its own input (RMSNorm), so the block does not add another norm.
    Heads are **summed**: every head makes its own top-k read of the shared value table with its
    own softmax weights, and the k·H weighted rows go into one embedding-bag sum (Lample et al.).
    """

    def __init__(self, d_model: int, config: PKMConfig):
        super().__init__()
        self.config = config
        c = config
        self.norm = RMSNorm(d_model)
        self.query = nn.Linear(d_model, c.heads * c.d_key)
        # (H, 2, S, d_k/2): one pair of codebooks per head
        self.keys = nn.Parameter(torch.empty(c.heads, 2, c.num_subkeys, c.d_key // 2))
        self.values = nn.EmbeddingBag(c.num_slots, c.d_value, mode="sum", sparse=True)
        self.out_proj = nn.Linear(c.d_value, d_model, bias=False)
        # Public knob for strategies (sparse memory finetuning): with `record_reads` on, every
        # forward leaves the slot ids it read in `last_reads` (B, T, H, k). Not state: off by
        # default and never saved, so nothing pays for it unless asked.
        self.record_reads = False
        self.last_reads: Tensor | None = None
        self.reset_parameters()

    def reset_parameters(self):
        c = self.config
        bound = 1.0 / math.sqrt(c.d_key)
        nn.init.uniform_(self.keys, -bound, bound)
        nn.init.normal_(self.values.weight, std=c.d_value**-0.5)
        nn.init.normal_(self.query.weight, std=0.02)
        nn.init.zeros_(self.query.bias)
        nn.init.normal_(self.out_proj.weight, std=0.02)

    def forward(self, x: Tensor) -> Tensor:
        B, T, _ = x.shape
        c = self.config
        q = self.query(self.norm(x)).view(B, T, c.heads, c.d_key)  # (B, T, H, d_k)
        # The lookup runs in the keys' dtype even under autocast: bfloat16 scores change top-k picks.
        with torch.autocast(device_type=x.device.type, enabled=False):
            look = self.lookup(q.to(self.keys.dtype))  # (B, T, H, k) each
        if self.record_reads:
            self.last_reads = look.idx.detach()
        flat_idx = look.idx.reshape(B * T, c.heads * c.topk)  # (B·T, H·k)
        flat_w = look.weights.reshape(B * T, c.heads * c.topk).to(self.values.weight.dtype)
        read = self.values(flat_idx, per_sample_weights=flat_w)  # (B·T, d_v), summed over heads
        return self.out_proj(read.view(B, T, c.d_value).to(x.dtype))

    def lookup(self, q: Tensor) -> Lookup:
        """Product-key top-k with this module's keys and score. q (B, T, H, d_k) -> slot ids and
        softmax weights, each (B, T, H, k), best first."""
        look, _ = product_key_lookup(q, self.keys.to(q.dtype), self.config.topk, self.config.score)
        return look

    def extra_repr(self) -> str:
        c = self.config
        return f"slots={c.num_slots}, heads={c.heads}, topk={c.topk}, score={c.score}"


def pkm_reference(x: Tensor, module: PKM, values: Tensor) -> Tensor:
    """Loop-based reference of PKM.forward for tests: one (row, token, head) at a time, full S
    scores per codebook with the direct distance ‖q − K‖², plain loops over the k×k candidates.
    `values` (N, d_v) is passed as a dense tensor so a test can take its gradient."""
    c = module.config
    B, T, _ = x.shape
    q = module.query(module.norm(x)).view(B, T, c.heads, 2, c.d_key // 2)
    rows = []
    for b in range(B):
        for t in range(T):
            read = values.new_zeros(c.d_value)
            for h in range(c.heads):
                best_per_codebook = []
                for m in range(2):
                    qm, km = q[b, t, h, m], module.keys[h, m]
                    if c.score == "dot":
                        s = torch.stack([qm @ km[i] for i in range(c.num_subkeys)])
                    else:
                        s = torch.stack(
                            [-torch.log(IDW_EPS + ((qm - km[i]) ** 2).sum()) for i in range(c.num_subkeys)]
                        )
                    top = sorted(range(c.num_subkeys), key=lambda i: -s[i].item())[: c.topk]
                    best_per_codebook.append([(s[i], i) for i in top])
                candidates = [
                    (sa + sb, a * c.num_subkeys + bb)
                    for sa, a in best_per_codebook[0]
                    for sb, bb in best_per_codebook[1]
                ]
                candidates.sort(key=lambda pair: -pair[0].item())
                chosen = candidates[: c.topk]
                w = torch.softmax(torch.stack([s for s, _ in chosen]), dim=0)
                for j, (_, slot) in enumerate(chosen):
                    read = read + w[j] * values[slot]
            rows.append(read)
    read = torch.stack(rows).view(B, T, c.d_value)
    return F.linear(read, module.out_proj.weight)
